"""Every policy-gradient algorithm on the default task: held-out accuracy curves from the same seeds and base.

    .venv/bin/python benchmarks/pg_family.py --json [--iterations 10] [--every 2] [--algorithms grpo,ppo]
    .venv/bin/python benchmarks/pg_family.py --smoke --json   # grpo and ppo, smoke shape, 1 iteration each

Runs ``configs/default.yaml`` once per ``train.algorithm`` (``rlfoundry run`` in a subprocess, one state dir
and one Prefect server for all), so every run starts from the same warmed-up base model (the first run pays
for the warm-up; the others find it in the store) with the same experiment seed: the rollouts of iteration 1
are the same for all, after that each policy samples its own. Held-out greedy accuracy (and pass@k) is
evaluated every ``--every`` iterations. Writes ``benchmarks/results/pg_family.json``; the last line
(``--json``) holds the raw curves, wall seconds per run, machine and versions, and ``ratio`` = the best
algorithm's final held-out gain over the base divided by GRPO's (1.0 when GRPO is best; None when GRPO
gained nothing). ``--smoke`` runs two algorithms (GRPO, which the ratio needs, and PPO, the one with a critic)
unless ``--algorithms`` is given: every algorithm's own run is tested by tests/integration/test_algorithms.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, python, result_file, temp_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "pg_family.json"
ALGORITHMS = ("grpo", "drgrpo", "rloo", "dapo", "gspo", "cispo", "ppo")


def run(algo: str, sets: list[str]) -> float:
    """One experiment with ``train.algorithm=algo``; its wall seconds."""
    args = ["run", "configs/default.yaml", "--run-id", f"pg-{algo}"]
    for s in [f"train.algorithm={algo}", *sets]:
        args += ["--set", s]
    t0 = time.perf_counter()
    r = python(["-m", "flows.cli", *args], cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{algo} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return round(time.perf_counter() - t0, 1)


def curve(algo: str, iterations: int) -> dict[str, Any]:
    """The run's held-out figures at every evaluated iteration, and its mean training reward per iteration."""
    from rl_core.artifacts.stage import committed
    from rl_core.artifacts.store import Store
    from rl_core.run.context import state_dir

    store, run_id = Store(str(state_dir() / "store")), f"pg-{algo}"
    points, reward = [], []
    for k in range(iterations + 1):
        ev = committed(store, run_id, k, "evaluate")
        if ev is not None:
            m = ev.metrics
            points.append({"iteration": k} | {n: m[n] for n in m if n == "accuracy" or n.startswith("pass@")})
        sc = committed(store, run_id, k, "score_rewards") if k else None
        if sc is not None:
            reward.append(round(sc.metrics["mean_reward"], 4))
    return {"heldout": points, "mean_reward": reward}


def summary(curves: dict[str, dict[str, Any]]) -> dict[str, Any]:
    gains = {a: c["heldout"][-1]["accuracy"] - c["heldout"][0]["accuracy"] for a, c in curves.items()}
    best = max(gains, key=gains.get)
    grpo = gains.get("grpo")
    return {
        "final_accuracy": {a: c["heldout"][-1]["accuracy"] for a, c in curves.items()},
        "gain": {a: round(g, 4) for a, g in gains.items()},
        "best": best,
        "ratio": round(gains[best] / grpo, 4) if grpo and grpo > 0 else None,
        "ratio_definition": "best algorithm's final held-out accuracy gain over the base / GRPO's",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--every", type=int, default=2, help="evaluate every this many iterations")
    ap.add_argument("--algorithms", help=f"comma-separated (default {','.join(ALGORITHMS)})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--json", action="store_true", help="print the result as the last line")
    add_smoke_flag(ap)
    args = ap.parse_args()
    temp_state("rlf-pg-family-")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from infra.localstack.prefect_server import ensure_api

    ensure_api()  # one Prefect server for every run (its URL is inherited by the subprocesses)
    if args.smoke:
        args.iterations, args.every, args.overrides = 1, 1, [*SMOKE_SHAPE, *args.overrides]
        args.algorithms = args.algorithms or "grpo,ppo"
    sets = [
        f"experiment.iterations={args.iterations}",
        f"eval.every={args.every}",
        "tracking.enabled=false",
        *args.overrides,
    ]
    algos = (args.algorithms or ",".join(ALGORITHMS)).split(",")
    wall, curves = {}, {}
    for algo in algos:
        wall[algo] = run(algo, sets)
        curves[algo] = curve(algo, args.iterations)
        acc = [p["accuracy"] for p in curves[algo]["heldout"]]
        print(f"{algo}: held-out accuracy {' '.join(f'{a:.3f}' for a in acc)} ({wall[algo]} s)", flush=True)
    result: dict[str, Any] = {"benchmark": "pg_family", "config": "configs/default.yaml", "overrides": sets}
    result.update(summary(curves))
    result["wall_s"] = wall
    result["curves"] = curves
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
