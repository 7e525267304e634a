"""The curriculum against uniform sampling: iterations to +30 held-out accuracy points, same seeds, same base.

    .venv/bin/python benchmarks/curriculum.py --json [--workload default --workload mix] [--out FILE]
    .venv/bin/python benchmarks/curriculum.py --smoke --json   # default workload, smoke shape, 1 iteration

Each workload is run twice through the full flow in one process, ``rollout.curriculum`` none and frontier
(``curriculum_keys: [op, digits]``), from the same warmed-up base model (the base is shared: same model,
task, warm-up and seed), evaluating every iteration with greedy accuracy only (``eval.pass_k: [1]``, one
sample). Workloads:

- ``default``: configs/default.yaml as it is (add/sub of 1-2 digit numbers), 10 iterations;
- ``mix``: the same with multiplication added (``task.env_args.operations=[add,sub,mul]``), a third of the
  problems far harder for this model, 20 iterations; its own warm-up (a new base model).

Per arm it records the held-out accuracy curve, the mean reward and the share of groups with no learning
signal (``score_rewards``' ``zero_std_groups``) per iteration, and the first iteration at which accuracy
reached base + 0.10, 0.20, 0.30. The last line is one JSON object; ``ratio`` is the default workload's
iterations to +30 points without the curriculum over with it (higher is better; null when an arm never got
there). The state dir (base models) defaults to ``.state/bench-curriculum``, so a rerun skips the warm-ups.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, smoke_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVAL = ["eval.every=1", "eval.pass_k=[1]", "eval.samples=1"]
WORKLOADS: dict[str, tuple[int, list[str]]] = {
    "default": (10, []),
    "mix": (20, ["task.env_args.operations=[add,sub,mul]"]),
}
ARMS = {
    "none": ["rollout.curriculum=none"],
    "frontier": ["rollout.curriculum=frontier", "rollout.curriculum_keys=[op,digits]"],
}
GAINS = (0.10, 0.20, 0.30)


def iterations_to(curve: list[dict[str, Any]], base: float, gain: float) -> int | None:
    """The first iteration whose held-out accuracy is at least ``base + gain`` (None: never).

    >>> iterations_to([{"iteration": 1, "accuracy": 0.5}, {"iteration": 2, "accuracy": 0.7}], 0.34, 0.3)
    2
    """
    return next((c["iteration"] for c in curve if c["accuracy"] >= base + gain - 1e-9), None)


def arm(workload: str, name: str, stamp: str, smoke: bool = False) -> dict[str, Any]:
    from flows.experiment import experiment_flow
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume
    from rl_core.schema.config import load_config

    iterations, extra = WORKLOADS[workload]
    if smoke:
        iterations, extra = 1, [*SMOKE_SHAPE, *extra]
    sets = [f"experiment.iterations={iterations}", *EVAL, *extra, *ARMS[name]]
    cfg = load_config(ROOT / "configs" / "default.yaml", sets)
    run_id = f"cur-{workload}-{name}-{stamp}"
    ctx = RunContext(cfg, run_id)
    create_or_resume(ctx, "new")
    t0 = time.perf_counter()
    out = experiment_flow(cfg, run_id)
    wall = time.perf_counter() - t0
    curve = []
    for k in range(1, iterations + 1):
        ms = {
            s: ctx.store.read_manifest(ctx.store.stage_uri(run_id, k, s))
            for s in ("score_rewards", "evaluate")
        }
        curve.append(
            {
                "iteration": k,
                "accuracy": ms["evaluate"].metrics["accuracy"],
                "mean_reward": round(ms["score_rewards"].metrics["mean_reward"], 4),
                "no_signal_groups": ms["score_rewards"].metrics["zero_std_groups"],
                **{
                    f"accuracy_{op}": ms["evaluate"].metrics.get(f"accuracy_{op}")
                    for op in ("add", "sub", "mul")
                },
            }
        )
    base = out["base_accuracy"]
    return {
        "run_id": run_id,
        "overrides": sets,
        "wall_s": round(wall, 1),
        "base_accuracy": base,
        "iterations_to": {f"+{round(g * 100)}": iterations_to(curve, base, g) for g in GAINS},
        "mean_no_signal_groups": round(sum(c["no_signal_groups"] for c in curve) / len(curve), 4),
        "curve": curve,
    }


def ratio(none: dict[str, Any], frontier: dict[str, Any], key: str) -> float | None:
    a, b = none["iterations_to"][key], frontier["iterations_to"][key]
    return None if a is None or b is None else round(a / b, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="default: all of them")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    smoke_state(args.smoke, "curriculum")
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "bench-curriculum"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    from infra.localstack.prefect_server import ensure_api

    ensure_api()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for w in args.workload or (["default"] if args.smoke else list(WORKLOADS)):
        none, frontier = (arm(w, a, stamp, args.smoke) for a in ARMS)
        results[w] = {
            "none": none,
            "frontier": frontier,
            "ratios": {f"+{round(g * 100)}": ratio(none, frontier, f"+{round(g * 100)}") for g in GAINS},
        }
        for a in (none, frontier):
            print(
                f"{w} {a['run_id']}: base {a['base_accuracy']:.3f}, iterations to {a['iterations_to']}, "
                f"no-signal groups {a['mean_no_signal_groups']:.3f}, {a['wall_s']:.0f} s"
            )
    first = results.get("default") or next(iter(results.values()))
    result = {
        "benchmark": "curriculum",
        "workloads": results,
        "total_wall_s": round(time.perf_counter() - t0, 1),
        "ratio": first["ratios"]["+30"],
    }
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
