"""The head in chunks against the whole logits, on the CPU: one train forward and backward of the taken
tokens' logprobs (``rl_core.training.ppo._stats``, the trainer's own path) with a 151,936-entry vocabulary.

    .venv/bin/python benchmarks/logprob_head.py --json [--rows 16] [--width 257] [--repeats 3]
    .venv/bin/python benchmarks/logprob_head.py --smoke --json

The policy: Qwen2.5's vocabulary (151,936, tied) on a 2-layer, 64-wide body, so that the head is the work, as
it is for a 0.5B model's float32 logits. Arms: ``whole`` (``train.logits_chunk_mb: 0``: ``[B, T, V]`` float32
logits, their log-softmax kept for the backward) and ``chunked`` (the default 512 MiB: the head on chunks of
positions, each recomputed in the backward). Each arm runs in a process of its own (its peak resident memory
is the process's), ``--repeats`` timed forward+backward passes after one untimed; the fastest counts.

The last line (``--json``): each arm's seconds and peak memory above the process's before the first pass,
the largest |difference| of the logprobs between the arms, and ``ratio`` = the whole arm's peak memory over
the chunked arm's (higher: the chunks save more); ``speed_ratio`` = whole seconds / chunked seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "logprob_head.json"
ARMS = ("whole", "chunked")


def policy(vocab: int) -> Any:
    """The GPU check's smoke body (2 layers, 64 wide, tied) with a vocabulary of ``vocab``, float32."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks.gpu_check import SMOKE_SHAPE

    torch.manual_seed(0)
    cfg = Qwen2Config(**{**SMOKE_SHAPE, "vocab_size": vocab, "max_position_embeddings": 4096})
    return Qwen2ForCausalLM(cfg).float().train()


def arm(name: str, rows: int, width: int, vocab: int, repeats: int, chunk_mb: float) -> dict[str, Any]:
    """One arm in this process: seconds of each forward+backward, peak RSS above the start, the logprobs."""
    import numpy as np
    import pandas as pd
    import torch

    from rl_core.training.ppo import _stats, make_batch

    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "prompt_ids": [list(rng.integers(3, vocab, 64)) for _ in range(rows)],
            "completion_ids": [list(rng.integers(3, vocab, width - 64)) for _ in range(rows)],
            "logprobs": [[-1.0] * (width - 64) for _ in range(rows)],
            "loss_mask": [[1] * (width - 64) for _ in range(rows)],
            "advantage": rng.normal(size=rows),
        }
    )
    model = policy(vocab)
    batch = make_batch(df, pad_id=0, logits_mb=chunk_mb if name == "chunked" else 0.0)
    every = torch.arange(rows)
    start_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    clock = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        lp, _ = _stats(model, batch, every, None, entropy=False)
        (lp * batch.loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        if i:
            clock.append(time.perf_counter() - t0)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "seconds": [round(c, 3) for c in clock],
        "best_s": round(min(clock), 3),
        "peak_mb_above_start": round((peak_kb - start_kb) / 1024, 1),
        "logprobs": lp.detach()[:, :8].tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--rows", type=int, default=16, help="sequences in the forward")
    ap.add_argument("--width", type=int, default=257, help="tokens per sequence (64 of them prompt)")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-mb", type=float, default=512.0, help="the chunked arm's train.logits_chunk_mb")
    ap.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # one arm, in its own process
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.width, args.vocab, args.repeats, args.chunk_mb = 2, 80, 50_000, 1, 8.0
    if args.arm:
        print(json.dumps(arm(args.arm, args.rows, args.width, args.vocab, args.repeats, args.chunk_mb)))
        return
    got = {}
    for name in ARMS:
        if args.smoke:  # in this process: the code path, not the memory
            got[name] = arm(name, args.rows, args.width, args.vocab, args.repeats, args.chunk_mb)
            continue
        cmd = [sys.executable, __file__, "--arm", name, "--rows", str(args.rows), "--width", str(args.width)]
        cmd += ["--vocab", str(args.vocab), "--repeats", str(args.repeats), "--chunk-mb", str(args.chunk_mb)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        got[name] = json.loads(done.stdout.strip().splitlines()[-1])
    gap = max(
        abs(a - b)
        for ra, rb in zip(got["whole"]["logprobs"], got["chunked"]["logprobs"], strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    whole, chunked = got["whole"], got["chunked"]
    result = {
        "benchmark": "logprob_head",
        "chunk_mb": args.chunk_mb,
        "shape": {
            "rows": args.rows,
            "width": args.width,
            "vocab": args.vocab,
            "positions": args.rows * (args.width - 1),
        },
        "arms": {k: {kk: vv for kk, vv in v.items() if kk != "logprobs"} for k, v in got.items()},
        "logprob_max_abs_diff": gap,
        "speed_ratio": round(whole["best_s"] / chunked["best_s"], 3),
        "ratio": round(whole["peak_mb_above_start"] / max(chunked["peak_mb_above_start"], 1.0), 2),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
