"""One train stage of a stored run, re-run from its stored inputs in the flow's process (world size 1) and as
a 2-rank torchrun job with ZeRO-1, ZeRO-2, ZeRO-3 and AutoTP=2: per-step losses against the single process,
what each rank holds (MB), and the stage's seconds.

    .venv/bin/python benchmarks/train_layouts.py --json     # -> benchmarks/results/train_layouts.json
    .venv/bin/python benchmarks/train_layouts.py --smoke --json   # smoke shape, in-process and ZeRO-2 only

The run is configs/default.yaml for one iteration (its base model is shared with any run of the default config
in the same state folder; the first call builds it). ``ratio`` is the in-process stage's seconds over the
slowest 2-rank job's: below 1 here, where a launch costs interpreters, imports and DeepSpeed's set-up on two
shared cores for an update of under a second (on a cluster the launch is amortised over a far longer update).
``--smoke`` runs one 2-rank layout (tests/integration/test_train_launch.py tests every layout's launch).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, python, result_file  # noqa: E402

LAYOUTS = {"zero1": (1, 1), "zero2": (2, 1), "zero3": (3, 1), "tp2": (0, 2)}
SMOKE_LAYOUTS = ("zero2",)
RUN_ID = "train-layouts"
OUT = ROOT / "benchmarks" / "results" / "train_layouts.json"


def _reference_run(state: Path, smoke: bool) -> None:
    if (state / "store" / RUN_ID / "iter-0001" / "train" / "_manifest.json").exists():
        return
    cmd = ["-m", "flows.cli", "run", "configs/default.yaml", "--run-id", RUN_ID]
    sets = ["experiment.iterations=1", "eval.samples=1", "eval.pass_k=[1]", *(SMOKE_SHAPE if smoke else [])]
    cmd += [a for s in sets for a in ("--set", s)]
    done = python(cmd, cwd=ROOT, env={**os.environ, "RLFOUNDRY_STATE_DIR": str(state)})
    if done.returncode != 0:
        raise RuntimeError(f"the reference run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def _stage(ctx: Any, inputs: dict[str, Any], out: str) -> tuple[dict[str, Any], float]:
    from rl_core.artifacts.stage import StageJob
    from rl_core.training.train import train_body

    t0 = time.perf_counter()
    result = train_body(ctx, StageJob(1, inputs, out))
    return result.metrics, round(time.perf_counter() - t0, 2)


def measure(state: Path, smoke: bool = False) -> dict[str, Any]:
    from rl_core.artifacts.stage import committed
    from rl_core.artifacts.store import Store
    from rl_core.run.context import RunContext
    from rl_core.run.runs import run_config
    from rl_core.schema.config import config_from_dict

    _reference_run(state, smoke)
    store = Store(f"file://{state}/store")
    data = run_config(store, RUN_ID).model_dump(mode="json")
    inputs = committed(store, RUN_ID, 1, "train").inputs
    one, one_s = _stage(RunContext(config_from_dict(data), RUN_ID, store), inputs, f"{store.root}/_bench/one")
    out: dict[str, Any] = {"one_process": {"seconds": one_s, "step_losses": one["step_losses"]}}
    for name in SMOKE_LAYOUTS if smoke else LAYOUTS:
        zero, tp = LAYOUTS[name]
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
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    ap.add_argument(
        "--state",
        type=Path,
        help="state folder (default .state/train_layouts; --smoke: $RLFOUNDRY_STATE_DIR or a temp folder)",
    )
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.state is None and args.smoke:
        given = os.environ.get("RLFOUNDRY_STATE_DIR")
        args.state = Path(given) if given else Path(tempfile.mkdtemp(prefix="rlf-smoke-train-layouts-"))
    state = (args.state or ROOT / ".state" / "train_layouts").resolve()
    os.environ["RLFOUNDRY_STATE_DIR"] = str(state)
    os.environ.setdefault("TQDM_DISABLE", "1")

    layouts = measure(state, args.smoke)
    slowest = max(v["seconds"] for k, v in layouts.items() if k != "one_process")
    batch = (
        "smoke shape: 32 completions, 1 optimizer step"
        if args.smoke
        else "512 completions, 8 optimizer steps"
    )
    result = {
        "benchmark": "train_layouts",
        "workload": f"configs/default.yaml, iteration 1's train stage ({batch})",
        "layouts": layouts,
        "ratio": round(layouts["one_process"]["seconds"] / slowest, 4),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
