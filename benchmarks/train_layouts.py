"""One train stage of a stored run, re-run from its stored inputs in the flow's process (world size 1) and as
a 2-rank torchrun job with ZeRO-1, ZeRO-2, ZeRO-3 and AutoTP=2: per-step losses against the single process,
what each rank holds (MB), and the stage's seconds.

    .venv/bin/python benchmarks/train_layouts.py --json     # -> benchmarks/results/train_layouts.json

The run is configs/default.yaml for one iteration (its base model is shared with any run of the default config
in the same state folder; the first call builds it). ``ratio`` is the in-process stage's seconds over the
slowest 2-rank job's: below 1 here, where a launch costs interpreters, imports and DeepSpeed's set-up on two
shared cores for an update of under a second (on a cluster the launch is amortised over a far longer update).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {"zero1": (1, 1), "zero2": (2, 1), "zero3": (3, 1), "tp2": (0, 2)}
RUN_ID = "train-layouts"


def _reference_run(state: Path) -> None:
    if (state / "store" / RUN_ID / "iter-0001" / "train" / "_manifest.json").exists():
        return
    cmd = [sys.executable, "-m", "flows.cli", "run", "configs/default.yaml", "--run-id", RUN_ID]
    cmd += ["--set", "experiment.iterations=1", "--set", "eval.samples=1", "--set", "eval.pass_k=[1]"]
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "RLFOUNDRY_STATE_DIR": str(state)})


def _stage(ctx: Any, inputs: dict[str, Any], out: str) -> tuple[dict[str, Any], float]:
    from rl_core.stage import StageJob
    from rl_core.train import train_body

    t0 = time.perf_counter()
    result = train_body(ctx, StageJob(1, inputs, out))
    return result.metrics, round(time.perf_counter() - t0, 2)


def measure(state: Path) -> dict[str, Any]:
    from rl_core.config import config_from_dict
    from rl_core.context import RunContext
    from rl_core.runs import run_config
    from rl_core.stage import committed
    from rl_core.store import Store

    _reference_run(state)
    store = Store(f"file://{state}/store")
    data = run_config(store, RUN_ID).model_dump(mode="json")
    inputs = committed(store, RUN_ID, 1, "train").inputs
    one, one_s = _stage(RunContext(config_from_dict(data), RUN_ID, store), inputs, f"{store.root}/_bench/one")
    out: dict[str, Any] = {"one_process": {"seconds": one_s, "step_losses": one["step_losses"]}}
    for name, (zero, tp) in LAYOUTS.items():
        data["train"] |= {"world_size": 2, "zero_stage": zero, "tp_size": tp}
        ctx = RunContext(config_from_dict(data), RUN_ID, store)
        m, s = _stage(ctx, inputs, f"{store.root}/_bench/{name}")
        gaps = [abs(a - b) for a, b in zip(m["step_losses"], one["step_losses"], strict=True)]
        out[name] = {
            "seconds": s,
            "max_loss_gap": max(gaps),
            "step_losses": m["step_losses"],
            **{k: v for k, v in m.items() if k.endswith("_mb")},
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "train_layouts.json")
    ap.add_argument("--state", type=Path, default=ROOT / ".state" / "train_layouts", help="state folder")
    args = ap.parse_args()
    os.environ["RLFOUNDRY_STATE_DIR"] = str(args.state)
    os.environ.setdefault("TQDM_DISABLE", "1")
    from benchmarks.common import finish

    layouts = measure(args.state)
    slowest = max(v["seconds"] for k, v in layouts.items() if k != "one_process")
    result = {
        "benchmark": "train_layouts",
        "workload": "configs/default.yaml, iteration 1's train stage (512 completions, 8 optimizer steps)",
        "layouts": layouts,
        "ratio": round(layouts["one_process"]["seconds"] / slowest, 4),
    }
    finish(result, args.out, args.json)


if __name__ == "__main__":
    main()
