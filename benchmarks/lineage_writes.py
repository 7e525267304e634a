"""Where the lineage records are written, measured inside one run: in the writer process or inline.

    .venv/bin/python benchmarks/lineage_writes.py --json           # default experiment, 32 iterations
    .venv/bin/python benchmarks/lineage_writes.py --iterations 16 --set rollout.engine=vllm
    .venv/bin/python benchmarks/lineage_writes.py --smoke --json   # smoke shape, 4 iterations, blocks of 2

One flow run of the default experiment (``configs/default.yaml``, the engine ``auto`` picks, MLflow on the
local SQLite store, evaluation only at the start and the end, off the clock) whose lineage writer changes mode
every ``--block`` iterations (4): iterations 1-4 in the writer process (``tracking.writes: process``), 5-8
inline (what ``auto`` picks here), 9-12 in the process, and so on (the mode is switched on the writer when an
iteration's records have gone, before the next iteration starts; the writer process is started before the
first, off the clock). The same records are written either way,
and the machine's drift, which moves whole runs by up to 1.7x here, moves both modes alike. (An earlier
version of this script compared the background thread with inline: ``benchmarks/results/lineage_writes.json``
of 2026-12-03, ratio 1.066 for inline.)

An iteration's records are written during the next ones when the process writes them (the flow waits for
it only when it falls two iterations behind), and at its own end when written inline; so the second half of
each block is timed: the process in its steady state, carrying earlier iterations' writes (CPU taken beside
the stages) and any wait for them. Reported: those steps' seconds in each mode, their medians, in how many
block pairs (by position) the process was the faster, the generate stage's seconds from the manifests by
mode, and per iteration the milliseconds the flow's thread spent on lineage (``critical_ms``): handing records
to the writer (``handoff_ms``; inline, the writes themselves) plus waiting for the writer process
(``wait_ms``: the next iteration's MLflow run it creates ahead, and the flush that keeps it at most two
iterations behind). Results before 2026-12-06 alternated every two iterations, switched the mode inside an
iteration's last writes and counted the hand-over only: their ``critical_ms`` mixed in inline writes and left
out every wait.

The last line is one JSON object; ``ratio`` is the inline median over the process median (above 1: the process
is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Evaluation off the clock: the flow's own evaluations only at steps 0 and N, greedy accuracy only.
SETS = ["eval.samples=1", "eval.pass_k=[1]", "eval.every=100000", "experiment.name=lineage_writes"]


def mode_at(k: int, block: int) -> str:
    """Iteration ``k``'s mode: blocks of ``block`` iterations alternate, starting in the writer process.

    >>> "".join(mode_at(k, 2)[0] for k in range(1, 9)), "".join(mode_at(k, 4)[0] for k in range(1, 9))
    ('ppiippii', 'ppppiiii')
    """
    return "inline" if (k - 1) // block % 2 == 1 else "process"


def timed(k: int, block: int) -> bool:
    """Whether iteration ``k`` is timed: the second half of its block.

    >>> [k for k in range(1, 9) if timed(k, 4)], [k for k in range(1, 5) if timed(k, 2)]
    ([3, 4, 7, 8], [2, 4])
    """
    return (k - 1) % block >= block // 2


def run(iterations: int, block: int, sets: list[str], smoke: bool) -> dict[str, Any]:
    from flows.experiment import experiment_flow
    from infra.localstack.prefect_server import ensure_api
    from rl_core.artifacts.report import subscribe
    from rl_core.artifacts.stage import committed
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume
    from rl_core.run.writer_process import WriterProcess
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
    submit, batch = writer.submit, writer.batch

    def handing(iteration: int, write: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return submit(iteration, write)
        finally:
            handed[iteration] = handed.get(iteration, 0.0) + time.perf_counter() - t0

    writer.submit = handing  # type: ignore[method-assign]
    waited: dict[int, float] = {}  # seconds the flow's thread waited on the writer process, per iteration
    now = {"switching": False}
    drain = WriterProcess.drain

    def waiting(self: Any, until: Any, timeout: float | None) -> None:
        t0 = time.perf_counter()
        try:
            return drain(self, until, timeout)
        finally:
            if until is not None and not now["switching"]:  # (not the benchmark's own flush, below)
                k = max(stamps, default=-1) + 1  # the iteration under way
                waited[k] = waited.get(k, 0.0) + time.perf_counter() - t0

    WriterProcess.drain = waiting  # type: ignore[method-assign]

    def stamp(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            stamps[ev["iteration"]] = (time.perf_counter(), ev.get("timings", {}).get("evaluate", 0.0))

    @contextlib.contextmanager
    def then_switch() -> Iterator[None]:
        """The iteration's records go (its batch), then the next iteration's mode is set."""
        with batch():
            yield
        nxt = mode_at(max(stamps, default=0) + 1, block)
        if nxt == "inline" and writer.mode == "process":  # the process's writes first (one SQLite writer
            now["switching"] = True  # at a time); the wait falls in the block's first iteration: not timed
            try:
                writer.flush()
            finally:
                now["switching"] = False
        writer.mode = nxt

    writer.batch = then_switch  # type: ignore[method-assign]
    writer.mode = mode_at(1, block)
    writer.submit(0, os.getpid)  # the process started, its imports done, off the clock (a run pays it once)
    writer.flush()
    unsubscribe = subscribe(stamp)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
        WriterProcess.drain = drain  # type: ignore[method-assign]
    step = {k: stamps[k][0] - stamps[k - 1][0] - stamps[k][1] for k in range(1, iterations + 1)}
    gen = {k: m.timings.seconds for k in step if (m := committed(ctx.store, run_id, k, "generate"))}
    by: dict[str, dict[str, list[float]]] = {"process": {}, "inline": {}}
    for k in range(1, iterations + 1):
        seen = by[mode_at(k, block)]
        seen.setdefault("handoff_ms", []).append(round(handed.get(k, 0.0) * 1000, 2))
        seen.setdefault("wait_ms", []).append(round(waited.get(k, 0.0) * 1000, 2))
        seen.setdefault("critical_ms", []).append(round((handed.get(k, 0.0) + waited.get(k, 0.0)) * 1000, 2))
    for k in filter(lambda k: timed(k, block), range(1, iterations + 1)):
        by[mode_at(k, block)].setdefault("step_s", []).append(round(step[k], 3))
        by[mode_at(k, block)].setdefault("generate_s", []).append(gen[k])
    pairs = list(zip(by["process"].get("step_s", []), by["inline"].get("step_s", []), strict=False))
    out: dict[str, Any] = {"run_id": run_id, "iterations": iterations, "block": block, "sets": overrides}
    out["engine"] = ctx.placement.rollout_engine
    for mode, seen in by.items():
        out[mode] = seen | {f"median_{n}": round(statistics.median(v), 3) for n, v in seen.items() if v}
    out["process_faster_pairs"] = f"{sum(p < i for p, i in pairs)} of {len(pairs)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=32, help="RL steps (whole pairs of blocks)")
    ap.add_argument("--block", type=int, default=4, help="iterations per mode before it switches (even)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="result file (default benchmarks/results/lineage_writes.json)")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.iterations, args.block = 4, 2
    if args.block < 2 or args.block % 2 or args.iterations % (2 * args.block):
        raise SystemExit(
            f"--iterations {args.iterations} --block {args.block}: need an even block, whole pairs of blocks"
        )
    if args.smoke and not os.environ.get("RLFOUNDRY_STATE_DIR"):
        os.environ["RLFOUNDRY_STATE_DIR"] = tempfile.mkdtemp(prefix="rlf-smoke-lineage-")
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "lineage_writes"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    result = {"benchmark": "lineage_writes", **run(args.iterations, args.block, args.sets, args.smoke)}
    proc, inl = result["process"]["median_step_s"], result["inline"]["median_step_s"]
    result["ratio"] = round(inl / proc, 4)
    print(
        f"step s (median of the blocks' second halves): process {proc}, inline {inl}; "
        f"process faster in {result['process_faster_pairs']} pairs; ratio {result['ratio']}; critical ms "
        f"(median) process {result['process']['median_critical_ms']}, "
        f"inline {result['inline']['median_critical_ms']}",
        flush=True,
    )
    out = result_file(args.out, ROOT / "benchmarks" / "results" / "lineage_writes.json", args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
