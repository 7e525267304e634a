"""What a rollout engine's start costs in a flow's process, with and without the frozen heap.

    .venv/bin/python benchmarks/engine_start.py --json            # 3 repeats per arm, alternating
    .venv/bin/python benchmarks/engine_start.py --smoke --json    # the smoke model, 1 repeat

vLLM runs ``gc.collect()`` five times while an engine starts and twice when it shuts down; each full
collection walks the whole heap of the process, and a flow's process holds torch, transformers, DeepSpeed,
vLLM, Prefect and MLflow (millions of objects). ``rl_core.generation.rollout.VLLMEngine`` collects once and
freezes what is alive (``gc.freeze``) before it builds the engine, so that vLLM's collections walk only what
the engine allocates. Each repeat is a process of its own that imports what a flow process imports, then
starts the project's engine (engine core in-process, as by default), generates a batch, and closes it: arm
``frozen`` as the code does it, arm ``unfrozen`` with the freeze (and its one collection) turned off — the
code before. The arms alternate, so both see the same machine load.

The last line is one JSON object: per arm the median seconds to start, to generate and to close; ``ratio``
is unfrozen / frozen start+close seconds (higher is better: > 1 means the freeze saves time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, finish, python, repeats_parser, smoke_state  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "engine_start.json"
# What a flow's process has imported when its first engine starts (the CLI's own imports aside).
FLOW_IMPORTS = ("torch", "transformers", "deepspeed", "vllm", "vllm.entrypoints.llm", "prefect", "mlflow")


class _NoFreeze:
    """``gc`` as rl_core.generation.rollout sees it in the ``unfrozen`` arm: collect and freeze do nothing."""

    def collect(self, *_: Any) -> int:
        return 0

    def freeze(self) -> None:
        pass


def arm(name: str, folder: str, max_model_len: int) -> dict[str, float]:
    """One repeat of one arm in this process: start, generate, close."""
    import gc
    import importlib

    for mod in FLOW_IMPORTS:
        importlib.import_module(mod)
    gc.unfreeze()  # a process forked from a frozen parent (the suite's fork server) starts as a fresh one
    import rl_core.generation.rollout as rollout
    from rl_core.generation.rollout import Request, SamplingSpec, start_engine
    from rl_core.schema.config import RolloutSection

    if name == "unfrozen":
        rollout.gc = _NoFreeze()  # type: ignore[assignment]
    objects = len(gc.get_objects())
    t0 = time.perf_counter()
    engine = start_engine("vllm", folder, RolloutSection(kv_cache_mb=64), max_model_len=max_model_len)
    t1 = time.perf_counter()
    engine.generate([Request([3, 4, 5], seed=i) for i in range(16)], SamplingSpec(n=4, max_tokens=8))
    t2 = time.perf_counter()
    engine.close()
    t3 = time.perf_counter()
    return {"start_s": t1 - t0, "generate_s": t2 - t1, "close_s": t3 - t2, "heap_objects": objects}


def _in_subprocess(name: str, folder: str, max_model_len: int) -> dict[str, float]:
    cmd = [__file__, "--arm", name, "--folder", folder, "--max-model-len", str(max_model_len)]
    r = python(cmd, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"arm {name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = repeats_parser(__doc__, OUT)
    ap.add_argument("--arm", choices=("frozen", "unfrozen"), help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--max-model-len", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.folder, args.max_model_len)))
        return
    if args.smoke:
        args.repeats, args.overrides = 1, [*SMOKE_SHAPE, *args.overrides]
    smoke_state(args.smoke, "engine-start")
    from benchmarks.common import default_policy
    from rl_core.models.model import save_checkpoint

    cfg, _, tok, model = default_policy(args.overrides)
    runs: dict[str, list[dict[str, float]]] = {"frozen": [], "unfrozen": []}
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, tok, d)
        for r in range(args.repeats):
            order = ("unfrozen", "frozen") if r % 2 == 0 else ("frozen", "unfrozen")
            for name in order:
                runs[name].append(_in_subprocess(name, d, cfg.model.max_position))
    med = {name: {k: statistics.median(x[k] for x in got) for k in got[0]} for name, got in runs.items()}
    cost = {name: m["start_s"] + m["close_s"] for name, m in med.items()}
    result = {
        "benchmark": "engine_start",
        "repeats": args.repeats,
        "overrides": args.overrides,
        "median": med,
        "runs": runs,
        "start_close_s": cost,
        "ratio": cost["unfrozen"] / cost["frozen"],
    }
    finish(result, None if args.smoke else (args.out or OUT), args.json, args.smoke)


if __name__ == "__main__":
    main()
