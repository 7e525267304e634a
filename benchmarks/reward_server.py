"""Scored rollouts per second through the reward server: batched requests vs one request per rollout.

    .venv/bin/python benchmarks/reward_server.py --json --out benchmarks/results/reward_server.json
    .venv/bin/python benchmarks/reward_server.py --smoke --json   # 10 training steps, 16 rollouts, 1 repeat

One reward server (``infra.reward_server``: vLLM's pooling runner) on a reward model trained for the smoke
config's arithmetic (``rlfoundry reward-model train``, or ``--model FOLDER``); the same rollouts (prompt +
completion texts drawn from the task: the answer or a wrong one, ``--rollouts`` of them, a default config's
iteration is 512) scored by the score stage's client (``rl_core.scoring.reward_client.RewardClient``) twice
per repeat: ``batched`` (``--batch-size`` texts per request, as ``reward.model.batch_size``) and
``one_by_one`` (one request per rollout). Best of ``--repeats``; the two modes' scores must agree within 1e-4.

The last line is one JSON object; ``ratio`` is batched / one-by-one throughput (goal >= 4).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, smoke_state  # noqa: E402

SMOKE_TRAINING = ["reward.model.train_steps=10", "reward.model.train_tasks=500"]


def _rollouts(cfg, n: int) -> list[str]:
    from envs.base import make_env
    from rl_core.scoring.reward_model import preference_pairs, score_text

    tasks = make_env(cfg.task.env, cfg.task.env_args).tasks("train", cfg.task, cfg.experiment.seed)
    pairs = preference_pairs(cfg.task.env, cfg.task.env_args, tasks, seed=0)
    rng = random.Random(0)
    return [score_text(p.prompt, rng.choice([p.chosen, p.rejected])) for p in pairs[:n]]


def _best(fn, repeats: int) -> tuple[float, list[float]]:
    times, out = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", type=Path, help="a reward model folder (default: train one for smoke.yaml)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.rollouts, args.batch_size, args.repeats = 16, 8, 1
    smoke_state(args.smoke, "reward-server")
    from rl_core.artifacts.paths import configure_env

    configure_env()
    from infra.reward_server import RewardServer
    from rl_core.schema.config import load_config
    from rl_core.scoring.reward_client import RewardClient
    from rl_core.scoring.reward_model import train_reward_model

    sets = SMOKE_TRAINING if args.smoke else []
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml", sets)
    texts = _rollouts(cfg, args.rollouts)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or Path(tmp) / "rm"
        trained = {} if args.model else train_reward_model(cfg, folder)
        server = RewardServer(folder)
        start = time.perf_counter()
        url = server.start()
        start_s = time.perf_counter() - start
        try:
            opts = {"timeout_s": 120, "retries": 0}
            batched = RewardClient(url, folder, batch_size=args.batch_size, **opts)
            single = RewardClient(url, folder, batch_size=1, **opts)
            batched.score(texts[: args.batch_size])  # warm-up
            b_s, b_scores = _best(lambda: batched.score(texts), args.repeats)
            s_s, s_scores = _best(lambda: single.score(texts), args.repeats)
        finally:
            server.stop()
    gap = max(abs(a - b) for a, b in zip(b_scores, s_scores, strict=True))
    if gap > 1e-4:
        raise SystemExit(f"batched and one-by-one scores differ by {gap}")
    result = {
        "benchmark": "reward_server",
        "rollouts": len(texts),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "server_start_s": round(start_s, 1),
        "batched_s": b_s,
        "one_by_one_s": s_s,
        "batched_rollouts_per_s": len(texts) / b_s,
        "one_by_one_rollouts_per_s": len(texts) / s_s,
        "max_score_gap": gap,
        "heldout_pairwise_accuracy": trained.get("heldout_pairwise_accuracy"),
        "ratio": s_s / b_s,
    }
    finish(result, args.out, args.json, args.smoke)
    if not args.json:
        print(
            f"batched {result['batched_rollouts_per_s']:.0f}/s vs one by one "
            f"{result['one_by_one_rollouts_per_s']:.0f}/s: x{result['ratio']:.1f}"
        )


if __name__ == "__main__":
    main()
