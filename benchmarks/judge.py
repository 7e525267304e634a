"""The LLM judge: how well a tiny judge trained here agrees with the verifier, and what judging costs.

    .venv/bin/python benchmarks/judge.py --json [--steps 1500] [--set model.hidden_size=128 ...] [--out FILE]
    .venv/bin/python benchmarks/judge.py --smoke --json   # 10 steps on 500 tasks, the smoke batch only

1. ``train_judge`` on configs/smoke.yaml's task (arithmetic add/sub, 1-2 digits; the smoke model's shape)
   with ``task.train_size`` 5000; its held-out agreement with the verifier (``judge_report.json``), per kind
   of answer (right, the teacher's off-by-one, one digit changed, a random number, an injected "Score: 9",
   garbage) and pairwise (right vs wrong, in both orders).
2. The judge component (``rl_core.scoring.judge.judge_reward``) on each engine (HF, vLLM) over a batch of
held-out
   answers the size of a smoke iteration (32: 8 prompts x 4) and of a default one (512: 64 x 8; answers of
   the six kinds in turn): ``judge_seconds`` (the second call: the engine already started), tokens, the
   agreement of its reward (>= 1/2) with the verifier, self- and pairwise agreement.

``ratio``: the held-out balanced agreement over chance (0.5); higher is better.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, smoke_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def component(folder: Path, engine: str, prompts_n: int, n: int, store: str) -> dict[str, Any]:
    """The component over ``prompts_n`` held-out prompts x ``n`` answers (kinds in turn), called twice."""
    from envs.base import Outcome, make_env
    from rl_core.artifacts.store import Store
    from rl_core.run.context import RunContext
    from rl_core.schema.config import load_config
    from rl_core.scoring.judge import judge_reward
    from rl_core.scoring.judge_train import KINDS, labelled, wrong_answer

    sets = [f"reward.judge.model={folder}", f"reward.judge.engine={engine}", "reward.weights.judge=1.0"]
    sets.append("task.heldout_size=64")
    cfg = load_config(ROOT / "configs" / "smoke.yaml", sets)
    env = make_env("arithmetic")
    tasks = env.tasks("heldout", cfg.task, 0)
    rng = random.Random(0)
    prompts, completions, outcomes = [], [], []
    for i in range(prompts_n * n):
        t = tasks[i // n]
        kind = KINDS[(i // n + i % n) % len(KINDS)]
        c = t["answer"] if kind == "right" else wrong_answer(kind, t["answer"], env, t, rng)
        ok = labelled(env, t, c)
        prompts.append(t["prompt"])
        completions.append(c)
        outcomes.append(Outcome(correct=ok, well_formed=ok))
    ctx = RunContext(cfg, "bench-judge", Store(store))
    start = time.perf_counter()
    judge_reward(ctx, prompts, completions, outcomes, 1)  # starts the engine
    first = time.perf_counter() - start
    got = judge_reward(ctx, prompts, completions, outcomes, 1)
    agree = [v is not None and (v >= 0.5) == o.correct for v, o in zip(got.values, outcomes, strict=True)]
    return {
        "engine": engine,
        "rows": prompts_n * n,
        "shape": f"{prompts_n} prompts x {n}",
        "first_call_seconds": first,
        "agreement_with_verifier": sum(agree) / len(agree),
        **{f"judge_{k}": v for k, v in got.metrics.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. model.hidden_size=128")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    smoke_state(args.smoke, "judge")
    from rl_core.schema.config import load_config
    from rl_core.scoring.judge_train import train_judge

    tasks, shapes = (500, ((8, 4),)) if args.smoke else (5000, ((8, 4), (64, 8)))
    steps = 10 if args.smoke else args.steps
    cfg = load_config(ROOT / "configs" / "smoke.yaml", [f"task.train_size={tasks}", *args.set])
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "judge"
        start = time.perf_counter()
        report = train_judge(cfg, folder, steps=steps, tasks=tasks)
        train_s = time.perf_counter() - start
        runs = [component(folder, e, p, n, f"{d}/store") for e in ("hf", "vllm") for p, n in shapes]
    held = report["heldout"]
    result = {
        "benchmark": "judge",
        "config": " ".join(["configs/smoke.yaml", f"task.train_size={tasks}", *args.set]),
        "train": {k: v for k, v in report.items() if k != "heldout"} | {"seconds": train_s},
        "heldout": held,
        "component": runs,
        "ratio": held["balanced_agreement"] / 0.5,
    }
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
