"""Asynchronous vs synchronous RL, side by side in one process: the same experiment (configs/default.yaml,
same seeds, same base model) with ``rollout.max_staleness`` 0 and 1, through the full flow.

    .venv/bin/python benchmarks/async.py --json [--iterations 20]
    .venv/bin/python benchmarks/async.py --smoke --json   # smoke shape, 2 iterations (1 timed) per arm

Reports, per arm, the wall time of iterations 2..N (iteration 1 also builds the train engine), iterations
per hour, and the reward and held-out accuracy against wall clock, so the curves can be compared at equal
time. The last line is one JSON object; ``ratio`` is the asynchronous arm's iterations per hour over the
synchronous one's (the reward curves are in the object beside it: compare before believing the ratio).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, temp_state  # noqa: E402


def arm(staleness: int, iterations: int, extra: list[str]) -> dict[str, Any]:
    from flows.experiment import experiment_flow
    from rl_core.artifacts.report import subscribe
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume
    from rl_core.schema.config import load_config

    root = Path(__file__).resolve().parents[1]
    sets = [f"experiment.iterations={iterations}", f"rollout.max_staleness={staleness}", *extra]
    cfg = load_config(root / "configs" / "default.yaml", sets)
    run_id = f"async-{staleness}"
    create_or_resume(RunContext(cfg, run_id), "new")
    events: list[dict[str, Any]] = []

    def record(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            events.append({**ev, "t": time.perf_counter()})

    unsubscribe = subscribe(record)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
    t1 = next(e["t"] for e in events if e["iteration"] == 1)
    curve = [
        {
            "iteration": e["iteration"],
            "wall_s": round(e["t"] - t1, 2),
            "mean_reward": e.get("mean_reward"),
            "accuracy": (e.get("eval") or {}).get("accuracy"),
        }
        for e in events
        if e["iteration"] >= 1
    ]
    wall = curve[-1]["wall_s"]
    return {
        "max_staleness": staleness,
        "timed_iterations": iterations - 1,
        "wall_s": wall,
        "iterations_per_hour": round((iterations - 1) * 3600 / wall, 1),
        "final_accuracy": curve[-1]["accuracy"],
        "mean_reward_last5": round(sum(c["mean_reward"] for c in curve[-5:]) / len(curve[-5:]), 4),
        "curve": curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="Config override")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    temp_state("rlf-async-")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from infra.localstack.prefect_server import ensure_api

    ensure_api()
    iterations, sets = args.iterations, args.overrides
    if args.smoke:  # iteration 1 builds the train engine: iteration 2 is the one timed
        iterations, sets = 2, [*SMOKE_SHAPE, *sets]
    sync, asyn = (arm(k, iterations, sets) for k in (0, 1))
    for a in (sync, asyn):
        print(
            f"max_staleness {a['max_staleness']}: {a['wall_s']:.1f} s for {a['timed_iterations']} iterations "
            f"({a['iterations_per_hour']:.0f}/h), final accuracy {a['final_accuracy']}, "
            f"mean reward (last 5) {a['mean_reward_last5']}"
        )
    result = {
        "benchmark": "async",
        "sync": sync,
        "async": asyn,
        "ratio": round(asyn["iterations_per_hour"] / sync["iterations_per_hour"], 4),
    }
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
