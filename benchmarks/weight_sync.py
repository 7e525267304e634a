"""Weight sync into a running rollout engine vs a plain in-memory copy of the state dict.

    .venv/bin/python benchmarks/weight_sync.py --json [--set model.hidden_size=512 --set model.num_layers=8]
    .venv/bin/python benchmarks/weight_sync.py --smoke --json   # the smoke model, 1 repeat

The engine is the project's own (``rl_core.generation.rollout.VLLMEngine``, engine core in-process as by
default). Three figures per repeat, best of ``--repeats``: ``copy_s`` (clone every tensor of the state dict:
the floor for moving the weights anywhere), ``memory_sync_s`` (what the train stage's output now takes to
reach the engine: the state dict handed to vLLM's ``reload_weights`` as an iterator, plus the prefix-cache
reset) and ``disk_sync_s`` (the previous path: write model.safetensors, reload it from the folder). After each
sync the engine's greedy outputs are checked against the weights it was given.

The last line is one JSON object; ``ratio`` is copy_s / memory_sync_s (1.0 = syncing costs no more than
copying the weights once).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, smoke_state  # noqa: E402


def _perturbed(state: dict, scale: float) -> dict:
    import torch

    g = torch.Generator().manual_seed(int(scale * 1000))
    return {
        k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
        for k, v in state.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="Config override")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.overrides = 1, [*SMOKE_SHAPE, *args.overrides]
    smoke_state(args.smoke, "weight-sync")
    from rl_core.artifacts.paths import configure_env

    configure_env()
    from benchmarks.common import default_policy
    from rl_core.generation.rollout import Request, SamplingSpec, start_engine
    from rl_core.models.model import WEIGHTS, save_checkpoint, save_weights

    cfg, tasks, tok, model = default_policy(args.overrides)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reqs = [
        Request(tok(t["prompt"], add_special_tokens=False)["input_ids"], seed=i)
        for i, t in enumerate(tasks[:16])
    ]
    greedy = SamplingSpec(n=1, temperature=0.0, max_tokens=8)
    copy_s, memory_s, disk_s = [], [], []
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, tok, d)
        engine = start_engine("vllm", d, cfg.rollout, max_model_len=cfg.model.max_position)
        for r in range(args.repeats):
            new = _perturbed(state, 0.01 * (r + 1))
            t = time.perf_counter()
            {k: v.clone() for k, v in new.items()}
            copy_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            engine.load_weights(d, new)
            memory_s.append(time.perf_counter() - t)
            from_memory = [c[0].token_ids for c in engine.generate(reqs, greedy)]
            t = time.perf_counter()
            save_weights(new, d)
            engine.load_weights(d)
            disk_s.append(time.perf_counter() - t)
            from_disk = [c[0].token_ids for c in engine.generate(reqs, greedy)]
            assert from_memory == from_disk, "the engine's outputs differ between the two syncs of one state"
            assert (Path(d) / WEIGHTS).exists()
    params = sum(v.numel() for v in state.values())
    result = {
        "benchmark": "weight_sync",
        "parameters": params,
        "megabytes": round(sum(v.numel() * v.element_size() for v in state.values()) / 2**20, 2),
        "copy_s": round(min(copy_s), 5),
        "memory_sync_s": round(min(memory_s), 5),
        "disk_sync_s": round(min(disk_s), 5),
        "memory_vs_disk": round(min(disk_s) / min(memory_s), 3),
        "ratio": round(min(copy_s) / min(memory_s), 4),
    }
    print(
        f"{params:,} parameters: copy {result['copy_s'] * 1e3:.1f} ms, sync from memory "
        f"{result['memory_sync_s'] * 1e3:.1f} ms, through disk {result['disk_sync_s'] * 1e3:.1f} ms"
    )
    finish(result, args.out, args.json, args.smoke)


if __name__ == "__main__":
    main()
