"""Code RL end to end: configs/code.yaml through the full flow, and its held-out pass-rate curve.

    .venv/bin/python benchmarks/code_curve.py --json [--iterations 30] [--set key=value ...]
    .venv/bin/python benchmarks/code_curve.py --smoke --json   # smoke shape, 1 iteration, writes nowhere

Runs the experiment of ``configs/code.yaml`` (the tiny built-in model, warmed up on a flawed teacher, then
GRPO against hidden tests run in the sandbox: ``envs/code/``) in this process and writes
``benchmarks/results/code_curve.json``: per iteration the wall seconds since the start (iteration 0 is init,
warm-up and the base model's evaluation), the stage timings, the mean training reward, the sandbox seconds
that execute_envs spent (from its manifest, when the stage reports ``sandbox_s``), and at every evaluation
the held-out greedy pass rate (``accuracy``) and pass@k. The last line (``--json``) is one JSON object with
the raw figures, the machine and library versions, and ``ratio`` = final held-out pass rate / the base
model's (None when the base model solved nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, result_file, temp_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "code_curve.json"


def run(
    sets: list[str], run_id: str, config: Path = ROOT / "configs" / "code.yaml"
) -> tuple[Any, list[dict[str, Any]]]:
    """Run the experiment of ``config``; the iteration events as they came, each with its wall time since the
    start (benchmarks/reasoning_gym_curve.py runs its own config through this too)."""
    from flows.experiment import experiment_flow
    from rl_core.artifacts.report import subscribe
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume
    from rl_core.schema.config import load_config

    cfg = load_config(config, sets)
    create_or_resume(RunContext(cfg, run_id), "new")
    events: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def record(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            events.append({**ev, "wall_s": round(time.perf_counter() - t0, 2)})

    unsubscribe = subscribe(record)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
    return cfg, events


def curve_rows(cfg: Any, run_id: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per iteration: time, reward, sandbox seconds and (where evaluated) the held-out figures."""
    from rl_core.artifacts.stage import committed
    from rl_core.run.context import RunContext

    store = RunContext(cfg, run_id).store
    rows = []
    for ev in events:
        k = ev["iteration"]
        env_stage = committed(store, run_id, k, "execute_envs") if k >= 1 else None
        metrics = env_stage.metrics if env_stage else {}
        row = {
            "iteration": k,
            "wall_s": ev["wall_s"],
            "timings": ev.get("timings", {}),
            "mean_reward": ev.get("mean_reward"),
            "correct": metrics.get("correct"),
            "sandbox_s": metrics.get("sandbox_s"),
        }
        if ev.get("eval"):
            row["heldout"] = {m: v for m, v in ev["eval"].items() if m == "accuracy" or m.startswith("pass@")}
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [(r["iteration"], r["wall_s"], r["heldout"]) for r in rows if "heldout" in r]
    base, final = evals[0][2]["accuracy"], evals[-1][2]["accuracy"]
    sandbox = [r["sandbox_s"] for r in rows if r["sandbox_s"] is not None]
    env_s = [r["timings"].get("execute_envs", 0.0) for r in rows if r["iteration"] >= 1]
    return {
        "base_pass_rate": base,
        "final_pass_rate": final,
        "pass_rate_vs_iteration": [[k, e["accuracy"]] for k, _, e in evals],
        "pass_rate_vs_seconds": [[s, e["accuracy"]] for _, s, e in evals],
        "base_pass_at_k": {m: v for m, v in evals[0][2].items() if m.startswith("pass@")},
        "final_pass_at_k": {m: v for m, v in evals[-1][2].items() if m.startswith("pass@")},
        "sandbox_s_per_iteration": round(sum(sandbox) / len(sandbox), 3) if sandbox else None,
        "execute_envs_s_per_iteration": round(sum(env_s) / len(env_s), 3) if env_s else None,
        "wall_s": rows[-1]["wall_s"],
        "ratio": round(final / base, 4) if base else None,
        "ratio_definition": "final held-out greedy pass rate / the warmed-up base model's",
    }


def curve_args(doc: str, run_id: str, out: Path) -> tuple[argparse.Namespace, list[str]]:
    """The command line of a curve benchmark (this one, benchmarks/reasoning_gym_curve.py), its state in a
    temporary folder and a Prefect API: the parsed arguments and the config overrides they make."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, help="override experiment.iterations")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    ap.add_argument("--run-id", default=run_id)
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {out.relative_to(ROOT)})")
    ap.add_argument("--json", action="store_true", help="print the result as the last line")
    add_smoke_flag(ap)
    args = ap.parse_args()
    temp_state(f"rlf-{run_id}-")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from infra.localstack.prefect_server import ensure_api

    ensure_api()
    if args.smoke:
        args.overrides, args.iterations = [*SMOKE_SHAPE, *args.overrides], 1
    sets = [*args.overrides] + ([f"experiment.iterations={args.iterations}"] if args.iterations else [])
    return args, sets


def main() -> None:
    args, sets = curve_args(__doc__ or "", "code-curve", OUT)
    cfg, events = run(sets, args.run_id)
    rows = curve_rows(cfg, args.run_id, events)
    result: dict[str, Any] = {"benchmark": "code_curve", "config": "configs/code.yaml", "overrides": sets}
    result.update(summary(rows))
    result["curve"] = rows
    print(
        f"held-out pass rate {result['base_pass_rate']:.3f} -> {result['final_pass_rate']:.3f} "
        f"(ratio {result['ratio']}) in {result['wall_s']:.0f} s; "
        f"sandbox {result['sandbox_s_per_iteration']} s/iteration"
    )
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
