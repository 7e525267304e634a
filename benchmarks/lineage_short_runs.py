"""Short runs, whole: the lineage records written inline against a writer process that the run starts with
itself, each run from the flow's start to its end (what decides ``tracking.writes: auto`` for short runs).

    .venv/bin/python benchmarks/lineage_short_runs.py --json                    # 64 x 1, 8 steps
    .venv/bin/python benchmarks/lineage_short_runs.py --workload default --json
    .venv/bin/python benchmarks/lineage_short_runs.py --smoke --json            # smoke shape, 2 steps

``benchmarks/lineage_writes.py`` times the two modes inside one long run, the writer process started off the
clock; a short run pays for that process's start (its imports and MLflow's store opened: ~2.9 CPU seconds
here, while the flow starts its engines) and its end. Here each arm is a process running one of
``benchmarks/vs_trl.py``'s workloads (its config, evaluation only at the start and the end, off the clock)
for ``--iterations`` steps with ``tracking.writes`` inline or process, in ABBA order over ``--rounds`` rounds,
all against one private Prefect server started first (an arm that had to build the shared base model is run
again, except in the smoke: only arms that found it are timed). Reported per mode: each arm's whole run
(``run_s``: the experiment flow's call, its start, the engines', every step, evaluation and the records' end
included), its median seconds per step (steps 2..N, as ``vs_trl.py`` counts them) and its start (``setup_s``:
to the end of the base model's evaluation), and the medians over the arms. The last line is one JSON object;
``ratio`` is inline's median whole run over the process's (above 1: the run with a writer process ends
sooner); ``step_ratio`` the same for the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import abba, arms_args, arms_result_file, arms_setup, finish, run_arms  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("inline", "process")


def arm(workload: str, iterations: int, mode: str, smoke: bool, run_id: str) -> dict[str, Any]:
    """In the arm's process: the workload's flow with ``tracking.writes: mode``, timed whole and per step."""
    from benchmarks import vs_trl

    vs_trl.profile_stages = lambda *a, **k: {}  # (only the run)
    vs_trl.EVAL_SETS = [*vs_trl.EVAL_SETS, f"tracking.writes={mode}"]
    args = argparse.Namespace(
        workload=workload, iterations=iterations, staleness=0, smoke=smoke, engine="auto", run_id=run_id
    )
    t0 = time.perf_counter()
    out = vs_trl.rlfoundry_arm(args)
    run_s = time.perf_counter() - t0
    clock = [0.0, *out["clock_s"]]
    steps = [b - a for a, b in zip(clock, clock[1:], strict=False)][1:] or [clock[-1]]
    step_s = round(statistics.median(steps), 4)
    found = out["base_was_cached"]
    return {"run_s": round(run_s, 3), "step_s": step_s, "setup_s": out["setup_s"], "base": found}


def run(workload: str, iterations: int, rounds: int, smoke: bool) -> dict[str, Any]:
    from infra.localstack.prefect_server import health_url, start
    from rl_core.artifacts.paths import free_port, state_dir

    port = free_port()
    where = state_dir() / "lineage_short_runs" / f"prefect-{time.strftime('%Y%m%d-%H%M%S')}"
    server = start(port, where, where / "server.log", ui=False, tie_to_parent=True)
    server.wait_http(health_url(port), timeout_s=120)
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}

    def cmd(mode: str, i: int) -> list[str]:
        run_id = f"lineage-short-{mode}-{time.strftime('%Y%m%d-%H%M%S')}-{i}"
        shape = ["--workload", workload, "--iterations", str(iterations), *(["--smoke"] if smoke else [])]
        return [__file__, "--arm", mode, *shape, "--run-id", run_id]

    def again(got: dict[str, Any]) -> bool:  # it built the shared base model: not timed (but in the smoke)
        return not got.pop("base") and not smoke

    try:
        by = run_arms("lineage_short_runs", abba(MODES, rounds), cmd, lambda _: env, again)
    finally:
        server.stop()
    return {"workload": workload, "iterations": iterations, "rounds": rounds, **by}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arms_args(ap, iterations=8, rounds=3, out="lineage_short_runs.json")
    ap.add_argument("--arm", choices=MODES, help=argparse.SUPPRESS)
    args = arms_setup(ap, "lineage_short_runs")
    if args.arm:
        print(json.dumps(arm(args.workload, args.iterations, args.arm, args.smoke, args.run_id)))
        return
    measured = run(args.workload, args.iterations, args.rounds, args.smoke)
    result = {"benchmark": "lineage_short_runs", **measured}
    inl, proc = result["inline"], result["process"]
    result["ratio"] = round(inl["median_run_s"] / proc["median_run_s"], 4)
    result["step_ratio"] = round(inl["median_step_s"] / proc["median_step_s"], 4)
    print(
        f"whole run s (median): inline {inl['median_run_s']}, process {proc['median_run_s']} (ratio "
        f"{result['ratio']}); step s: inline {inl['median_step_s']}, process {proc['median_step_s']} "
        f"({result['step_ratio']})",
        flush=True,
    )
    out = arms_result_file(args, "lineage_short_runs")
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
