"""Where the lineage records are written, measured inside one run: in the writer process or inline.

    .venv/bin/python benchmarks/lineage_writes.py --json           # default experiment, 32 iterations
    .venv/bin/python benchmarks/lineage_writes.py --iterations 16 --set rollout.engine=vllm
    .venv/bin/python benchmarks/lineage_writes.py --smoke --json   # smoke shape, 4 iterations

One flow run of the default experiment (``configs/default.yaml``, the engine ``auto`` picks, MLflow on the
local SQLite store, evaluation only at the start and the end, off the clock) whose lineage writer changes mode
every two iterations: iterations 1-2 in the writer process (``tracking.writes: process``, what ``auto`` picks
here), 3-4 inline (the earlier default), 5-6 in the process, and so on (the mode is switched on the writer
between iterations). The same records are written either way, and the machine's drift, which moves whole runs
by up to 1.7x here, moves both modes alike. (An earlier version of this script compared the background thread
with inline: ``benchmarks/results/lineage_writes.json`` of 2026-12-03, ratio 1.066 for inline.)

An iteration's records are written during the next iteration when the process writes them, and at its own end
when written inline; so the second iteration of each pair is the one timed: it carries the first one's
process writes (CPU taken beside the stages), or its own inline ones. Reported: those steps' seconds in each
mode, their medians, in how many adjacent pairs the process was the faster, the generate stage's seconds from
the manifests by mode, and the milliseconds the flow's thread spent handing records to the writer in each
iteration (``critical_ms``: inline, the writes themselves).

The last line is one JSON object; ``ratio`` is the inline median over the process median (above 1: the process
is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Evaluation off the clock: the flow's own evaluations only at steps 0 and N, greedy accuracy only.
SETS = ["eval.samples=1", "eval.pass_k=[1]", "eval.every=100000", "experiment.name=lineage_writes"]


def mode_at(k: int) -> str:
    """Iteration ``k``'s mode: pairs alternate, starting in the writer process.

    >>> [mode_at(k)[0] for k in range(1, 9)]
    ['p', 'p', 'i', 'i', 'p', 'p', 'i', 'i']
    """
    return "inline" if (k - 1) // 2 % 2 == 1 else "process"


def run(iterations: int, sets: list[str], smoke: bool) -> dict[str, Any]:
    from flows.experiment import experiment_flow
    from infra.localstack.prefect_server import ensure_api
    from rl_core.artifacts.report import subscribe
    from rl_core.artifacts.stage import committed
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume
    from rl_core.schema.config import load_config
    from tasks.common import lineage_writer

    ensure_api()
    overrides = [*SETS, *(SMOKE_SHAPE if smoke else []), *sets, f"experiment.iterations={iterations}"]
    cfg = load_config(ROOT / "configs" / "default.yaml", overrides)
    if not cfg.tracking.enabled:
        raise SystemExit("lineage_writes: tracking.enabled is false; there is nothing to write")
    run_id = f"lineage-writes-{time.strftime('%Y%m%d-%H%M%S')}"
    ctx = RunContext(cfg, run_id)
    create_or_resume(ctx, "new")
    writer = lineage_writer(cfg)
    stamps: dict[int, tuple[float, float]] = {}
    handed: dict[int, float] = {}  # seconds the flow's thread spent in the writer's submit, per iteration
    submit = writer.submit

    def timed(iteration: int, write: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return submit(iteration, write)
        finally:
            handed[iteration] = handed.get(iteration, 0.0) + time.perf_counter() - t0

    writer.submit = timed  # type: ignore[method-assign]

    def switch(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":  # iteration k has ended: k + 1's records go the next mode's way
            stamps[ev["iteration"]] = (time.perf_counter(), ev.get("timings", {}).get("evaluate", 0.0))
            writer.mode = mode_at(ev["iteration"] + 1)
            if writer.mode == "inline":  # the process's writes done first (one SQLite writer at a time);
                writer.flush()  # this wait falls in the pair's first iteration, which is not timed

    writer.mode = mode_at(1)
    unsubscribe = subscribe(switch)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
    step = {k: stamps[k][0] - stamps[k - 1][0] - stamps[k][1] for k in range(1, iterations + 1)}
    gen = {k: m.timings.seconds for k in step if (m := committed(ctx.store, run_id, k, "generate"))}
    by: dict[str, dict[str, list[float]]] = {"process": {}, "inline": {}}
    for k in range(1, iterations + 1):
        by[mode_at(k)].setdefault("critical_ms", []).append(round(handed.get(k, 0.0) * 1000, 2))
    for k in range(2, iterations + 1, 2):  # the second iteration of each pair
        by[mode_at(k)].setdefault("step_s", []).append(round(step[k], 3))
        by[mode_at(k)].setdefault("generate_s", []).append(gen[k])
    pairs = list(zip(by["process"].get("step_s", []), by["inline"].get("step_s", []), strict=False))
    out: dict[str, Any] = {"run_id": run_id, "iterations": iterations, "sets": overrides}
    out["engine"] = ctx.placement.rollout_engine
    for mode, seen in by.items():
        out[mode] = seen | {f"median_{n}": round(statistics.median(v), 3) for n, v in seen.items() if v}
    out["process_faster_pairs"] = f"{sum(p < i for p, i in pairs)} of {len(pairs)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=32, help="RL steps (a multiple of 4: whole pairs)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="result file (default benchmarks/results/lineage_writes.json)")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.iterations = 4
    if args.iterations < 4 or args.iterations % 4:
        raise SystemExit(f"--iterations {args.iterations}: need a multiple of 4 (pairs of each mode)")
    if args.smoke and not os.environ.get("RLFOUNDRY_STATE_DIR"):
        os.environ["RLFOUNDRY_STATE_DIR"] = tempfile.mkdtemp(prefix="rlf-smoke-lineage-")
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "lineage_writes"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    result = {"benchmark": "lineage_writes", **run(args.iterations, args.sets, args.smoke)}
    proc, inl = result["process"]["median_step_s"], result["inline"]["median_step_s"]
    result["ratio"] = round(inl / proc, 4)
    print(
        f"step s (median of the pairs' second iterations): process {proc}, inline {inl}; "
        f"process faster in {result['process_faster_pairs']} pairs; ratio {result['ratio']}; critical ms "
        f"(median) process {result['process']['median_critical_ms']}, "
        f"inline {result['inline']['median_critical_ms']}",
        flush=True,
    )
    out = result_file(args.out, ROOT / "benchmarks" / "results" / "lineage_writes.json", args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
