"""What orchestration costs: the same RL iterations through the full flow (Prefect tasks, manifests, MLflow
lineage, progress events) and as the bare stage bodies in a plain Python loop, side by side in one process.

    .venv/bin/python benchmarks/orchestration.py --json            # both workloads
    .venv/bin/python benchmarks/orchestration.py --workload default --iterations 6
    .venv/bin/python benchmarks/orchestration.py --smoke --json   # generation workload, smoke shape, 2 its

Workloads: ``default`` is configs/default.yaml (8-token answers, 64 prompts x 8 samples), shorter warm-up;
``generation`` is the generation-heavy shape of issue 11 (64 prompts x 8 samples x up to 128 tokens): the
default model with a one-step warm-up, so it rarely stops before ``max_tokens``. Both arms share the
committed base model and start their own rollout engine before the clock starts; the clock covers iterations
2..N (iteration 1 also builds the train engine, the same one-off cost in both arms). Both write the stage
outputs (the bodies do); only the full flow writes manifests, runs Prefect tasks and logs to MLflow.

The last line is one JSON object; ``ratio`` is the generation-heavy workload's bare time / orchestrated time
(1.0 = orchestration costs nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, python, temp_state  # noqa: E402

WORKLOADS: dict[str, list[str]] = {
    "default": ["warmup.steps=300"],
    "generation": [
        "warmup.steps=1",
        "model.max_position=160",
        "rollout.max_tokens=128",
        "eval.samples=1",
        "eval.pass_k=[1]",
        "task.heldout_size=64",
    ],
}


def _config(workload: str, iterations: int, smoke: bool = False) -> Any:
    from rl_core.schema.config import load_config

    root = Path(__file__).resolve().parents[1]
    sets = [*WORKLOADS[workload], f"experiment.iterations={iterations}", "experiment.name=orchestration"]
    sets += SMOKE_SHAPE if smoke else []
    return load_config(root / "configs" / "default.yaml", sets)


def orchestrated(cfg: Any, run_id: str) -> list[float]:
    """Seconds of each iteration through ``experiment_flow`` (the gap between its iteration events)."""
    from flows.experiment import experiment_flow
    from rl_core.artifacts.report import subscribe
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume

    create_or_resume(RunContext(cfg, run_id), "new")
    stamps: dict[int, float] = {}

    def stamp(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            stamps.setdefault(ev["iteration"], time.perf_counter())

    unsubscribe = subscribe(stamp)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
    return [stamps[k] - stamps[k - 1] for k in range(1, cfg.experiment.iterations + 1)]


def bare(cfg: Any, run_id: str) -> list[float]:
    """Seconds of each iteration of the stage bodies called in a plain loop (inputs from the table, held in
    memory; no manifests, no Prefect, no MLflow)."""
    from rl_core.artifacts.stage import StageJob, committed
    from rl_core.generation.episodes import policy_engine
    from rl_core.pipeline.stages import ITERATION, STAGES, resolve_inputs
    from rl_core.run.context import RunContext

    ctx = RunContext(cfg, run_id)
    done: dict[tuple[str, int], Any] = {}

    def lookup(stage: str, k: int) -> Any:
        return committed(ctx.store, ctx.base_id, 0, stage) if STAGES[stage].base else done.get((stage, k))

    policy_engine(ctx, lookup("warmup", 0).outputs["checkpoint"], 0)
    times = []
    for k in range(cfg.experiment.iterations + 1):
        t0 = time.perf_counter()
        for spec in ITERATION:
            if not spec.due(cfg, k) or (k == 0 and spec.name != "evaluate"):
                continue
            job = StageJob(k, resolve_inputs(spec, cfg, k, lookup), ctx.store.stage_uri(run_id, k, spec.name))
            done[(spec.name, k)] = SimpleNamespace(outputs=spec.body(ctx, job).outputs)
        times.append(time.perf_counter() - t0)
    return times[1:]


def measure(workload: str, iterations: int, smoke: bool = False) -> dict[str, Any]:
    cfg = _config(workload, iterations, smoke)
    full = orchestrated(cfg, f"orch-{workload}")
    plain = bare(cfg, f"bare-{workload}")
    timed_full, timed_bare = sum(full[1:]), sum(plain[1:])
    return {
        "iterations": iterations,
        "timed_iterations": iterations - 1,
        "orchestrated_s": [round(x, 3) for x in full],
        "bare_s": [round(x, 3) for x in plain],
        "orchestrated_total_s": round(timed_full, 3),
        "bare_total_s": round(timed_bare, 3),
        "ratio": round(timed_bare / timed_full, 4),
    }


def _in_subprocess(workload: str, iterations: int) -> dict[str, Any]:
    out = python([__file__, "--workload", workload, "--iterations", str(iterations), "--json"])
    if out.returncode != 0:
        raise RuntimeError(f"{workload} workload failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["workloads"][workload]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:  # the headline workload in this process; iteration 2 is the one timed
        args.iterations = 2
        args.workload = "generation" if args.workload == "both" else args.workload
    temp_state("rlf-orch-")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from infra.localstack.prefect_server import ensure_api

    ensure_api()  # one Prefect server for both workloads (the subprocesses inherit PREFECT_API_URL)
    if args.workload == "both":  # one process per workload: each starts its own engines from scratch
        found = {w: _in_subprocess(w, args.iterations) for w in WORKLOADS}
    else:
        found = {args.workload: measure(args.workload, args.iterations, args.smoke)}
    for w, r in found.items():
        print(
            f"{w:>10}: bare {r['bare_total_s']:.2f} s, orchestrated {r['orchestrated_total_s']:.2f} s over "
            f"{r['timed_iterations']} iterations -> ratio {r['ratio']:.3f}"
        )
    headline = found.get("generation", next(iter(found.values())))["ratio"]
    result = {"benchmark": "orchestration", "workloads": found, "ratio": headline}
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
