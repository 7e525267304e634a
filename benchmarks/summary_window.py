"""The experiment run's summary rows and the vital-sign tables written per iteration or per window, measured
inside one run.

    .venv/bin/python benchmarks/summary_window.py --json                  # 64 x 1 (vs_trl's shape), 72 steps
    .venv/bin/python benchmarks/summary_window.py --workload default --iterations 48 --json
    .venv/bin/python benchmarks/summary_window.py --smoke --json          # smoke shape, 4 iterations

One flow run of one of ``benchmarks/vs_trl.py``'s workloads (its config and overrides, evaluation only at the
start and the end, off the clock) whose ``RecordWindow`` (``tracking.summary_every_s``, ``flows.observe``)
switches every ``--block`` iterations (6): in the first block each iteration's row on the experiment's MLflow
run and its vital-sign table in the Prefect UI are written as it ends (``summary_every_s: 0``), in the next
block they are held and written together at the block's last iteration (one ``log_batch``, one table: what a
window does at any step shorter than ``summary_every_s`` / block; at the default 10 s and a 0.36 s step a
window holds ~28 iterations, so a block of 6 understates it), and so on. The iterations' own MLflow runs,
their stage records and everything else are written the same way in both. A block's seconds are all of its
steps, the writing one included; the first pair of blocks is not timed (warm-up).

Reported per mode: each block's mean step, their median, and in how many adjacent block pairs the window was
the faster. The last line is one JSON object; ``ratio`` is the per-iteration median over the window's (above
1: the window is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, new_run, result_file, smoke_state, workload_config_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def mode_at(k: int, block: int) -> str:
    """Iteration ``k``'s mode: blocks of ``block`` iterations alternate, starting with each iteration's own.

    >>> "".join(mode_at(k, 3)[0] for k in range(1, 13))
    'eeewwweeewww'
    """
    return "window" if (k - 1) // block % 2 == 1 else "each"


class BlockWindow:
    """``flows.observe.RecordWindow`` with blocks for a clock: each iteration as it ends in an ``each``
    block, the held ones at a ``window`` block's last iteration (as ever, at the run's last and an alarm)."""

    block = 6

    def __init__(self, every_s: float, clock: Any = None) -> None:
        self.held: list[dict[str, Any]] = []

    def add(self, summary: dict[str, Any], at_once: bool = False) -> list[dict[str, Any]]:
        self.held.append(summary)
        k = summary["iteration"]
        if at_once or mode_at(k, self.block) == "each" or k % self.block == 0:
            return self.take()
        return []

    def take(self) -> list[dict[str, Any]]:
        out, self.held = self.held, []
        return out


def run(workload: str, iterations: int, block: int, sets: list[str], smoke: bool) -> dict[str, Any]:
    import flows.experiment as experiment
    from rl_core.artifacts.report import subscribe

    cfg = workload_config_for("summary_window", workload, iterations, sets, smoke)
    if not cfg.tracking.enabled:
        raise SystemExit("summary_window: tracking.enabled is false; there is nothing to write")
    run_id, ctx = new_run(cfg, "summary_window")
    stamps: dict[int, tuple[float, float]] = {}
    written: dict[int, int] = {}  # iteration -> how many rows went out with it

    def stamp(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            stamps[ev["iteration"]] = (time.perf_counter(), ev.get("timings", {}).get("evaluate", 0.0))
            written[ev["iteration"]] = len(ev.get("tables", []))

    BlockWindow.block = block
    kept = experiment.RecordWindow
    experiment.RecordWindow = BlockWindow  # type: ignore[misc,assignment]
    unsubscribe = subscribe(stamp)
    try:
        experiment.experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
        experiment.RecordWindow = kept  # type: ignore[misc]
    step = {k: stamps[k][0] - stamps[k - 1][0] - stamps[k][1] for k in range(1, iterations + 1)}
    first = 1 if smoke else 2 * block + 1  # the first pair of blocks warms up (not in the smoke)
    by: dict[str, dict[str, list[float]]] = {"each": {}, "window": {}}
    for start in range(first, iterations + 1, block):
        ks = range(start, start + block)
        seen = by[mode_at(start, block)]
        seen.setdefault("block_mean_step_s", []).append(round(statistics.fmean(step[k] for k in ks), 4))
        seen.setdefault("writes", []).append(sum(1 for k in ks if written[k]))
    pairs = list(zip(by["each"]["block_mean_step_s"], by["window"]["block_mean_step_s"], strict=True))
    out: dict[str, Any] = {"run_id": run_id, "workload": workload, "iterations": iterations, "block": block}
    out |= {"sets": sets, "engine": ctx.placement.rollout_engine}
    for mode, seen in by.items():
        out[mode] = seen | {"median_step_s": round(statistics.median(seen["block_mean_step_s"]), 4)}
    out["window_faster_pairs"] = f"{sum(w < e for e, w in pairs)} of {len(pairs)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="64x1", help="a workload of benchmarks/vs_trl.py (default 64x1)")
    ap.add_argument("--iterations", type=int, default=72, help="RL steps (whole pairs of blocks)")
    ap.add_argument("--block", type=int, default=6, help="iterations per mode before it switches")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="result file (default benchmarks/results/summary_window.json)")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.iterations, args.block = 4, 2
    if (
        args.block < 2
        or args.iterations % (2 * args.block)
        or args.iterations < (2 if args.smoke else 4) * args.block
    ):
        raise SystemExit(
            f"--iterations {args.iterations} --block {args.block}: need whole pairs of blocks, at least two"
        )
    smoke_state(args.smoke, "summary-window")
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "summary_window"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    result = {
        "benchmark": "summary_window",
        **run(args.workload, args.iterations, args.block, args.sets, args.smoke),
    }
    each, window = result["each"]["median_step_s"], result["window"]["median_step_s"]
    result["ratio"] = round(each / window, 4)
    print(
        f"step s (median of block means): each iteration {each}, window {window}; window faster in "
        f"{result['window_faster_pairs']} pairs; ratio {result['ratio']}",
        flush=True,
    )
    name = "summary_window" + (f"_{args.workload}" if args.workload != "64x1" else "") + ".json"
    out = result_file(args.out, ROOT / "benchmarks" / "results" / name, args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
