"""What full checkpoints every iteration cost: the same run with ``train.checkpoint_every`` 1 and N.

    .venv/bin/python benchmarks/checkpoint_cadence.py --json [--every 10] [--iterations 6] [--set k=v ...]
    .venv/bin/python benchmarks/checkpoint_cadence.py --smoke --json   # smoke policy, every 2, 2 iterations

Both arms run the full flow (``benchmarks/orchestration.py``'s ``orchestrated``: Prefect, manifests, MLflow)
on the default experiment with a larger policy (``--set`` defaults below: ~25M parameters, so the checkpoint
is worth measuring), each in a process of its own, from the same committed base model. Reported per arm: the
seconds of each timed iteration (iteration 1, which also starts the train engine, is left out), the train
stages' own seconds from their manifests, and the bytes written under the run's folder. Both arms end with
the same policy hashes (checked here: the cadence changes what is written, never the weights).

The last line is one JSON object; ``ratio`` is every-iteration time / cadence time over the timed iterations
(higher = the cadence saves more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, python, temp_state  # noqa: E402

POLICY = [
    "model.hidden_size=512",
    "model.intermediate_size=2048",
    "model.num_heads=8",
    "model.num_layers=8",
    "warmup.steps=20",
    "rollout.prompts_per_iteration=16",
    "eval.every=100",
    "task.heldout_size=32",
    "eval.samples=1",
    "eval.pass_k=[1]",
]


def arm(every: int, iterations: int, sets: list[str], smoke: bool = False) -> dict[str, Any]:
    """One arm in this process: run the flow, then read back its train stages and what it wrote."""
    from benchmarks.orchestration import orchestrated
    from rl_core.artifacts.stage import committed
    from rl_core.run.context import RunContext
    from rl_core.schema.config import load_config

    root = Path(__file__).resolve().parents[1]
    policy = SMOKE_SHAPE if smoke else POLICY
    overrides = [*policy, *sets, f"experiment.iterations={iterations}", f"train.checkpoint_every={every}"]
    cfg = load_config(root / "configs" / "default.yaml", [*overrides, "experiment.name=cadence"])
    run_id = f"every-{every}"
    per_iteration = orchestrated(cfg, run_id)
    ctx = RunContext(cfg, run_id)
    trains = [committed(ctx.store, run_id, k, "train") for k in range(1, iterations + 1)]
    run_dir = Path(ctx.store.run_uri(run_id).removeprefix("file://"))
    return {
        "checkpoint_every": every,
        "iteration_s": [round(x, 3) for x in per_iteration],
        "timed_s": round(sum(per_iteration[1:]), 3),
        "train_stage_s": [m.timings.seconds for m in trains if m],
        "bytes_written": sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()),
        "policy_sha256": [m.metrics["policy_sha256"] for m in trains if m],
    }


def _in_subprocess(every: int, iterations: int, sets: list[str], smoke: bool) -> dict[str, Any]:
    cmd = [__file__, "--arm", str(every), "--iterations", str(iterations)]
    cmd += [a for s in sets for a in ("--set", s)] + (["--smoke"] if smoke else [])
    out = python(cmd)
    if out.returncode != 0:
        raise RuntimeError(f"checkpoint_every={every} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, default=10, help="the cadence arm's train.checkpoint_every")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override (both arms)")
    ap.add_argument("--arm", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke and args.arm is None:  # the smoke policy; iteration 2 is the one timed
        args.every, args.iterations = 2, 2
    temp_state("rlf-cadence-")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.arm is not None:
        print(json.dumps(arm(args.arm, args.iterations, args.sets, args.smoke)))
        return
    from infra.localstack.prefect_server import ensure_api

    ensure_api()  # one Prefect server for both arms (the subprocesses inherit PREFECT_API_URL)
    every1 = _in_subprocess(1, args.iterations, args.sets, args.smoke)
    cadence = _in_subprocess(args.every, args.iterations, args.sets, args.smoke)
    if every1["policy_sha256"] != cadence["policy_sha256"]:
        raise SystemExit("the two arms ended with different weights: the cadence must not change them")
    ratio = every1["timed_s"] / cadence["timed_s"]
    print(
        f"every iteration {every1['timed_s']:.2f} s ({every1['bytes_written'] / 1e6:.0f} MB written), "
        f"every {args.every}: {cadence['timed_s']:.2f} s ({cadence['bytes_written'] / 1e6:.0f} MB) "
        f"over {args.iterations - 1} iterations -> ratio {ratio:.3f}"
    )
    result = {
        "benchmark": "checkpoint_cadence",
        "every_1": every1,
        "cadence": cadence,
        "ratio": round(ratio, 4),
    }
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
