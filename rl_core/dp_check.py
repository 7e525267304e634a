"""Data-parallel equivalence check: the same policy update on 1 or N DeepSpeed ranks gives the same losses.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 -m rl_core.dp_check --zero-stage 2 --out losses.json

Every rank builds the same tiny model and synthetic RL batch from fixed seeds; ``ppo_update`` splits each
mini-batch over the ranks and normalises by the global token count, so the losses must match a single process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def synthetic_batch(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        plen, clen = int(rng.integers(3, 7)), int(rng.integers(1, 6))
        out.append(
            {
                "prompt_ids": rng.integers(2, 16, size=plen).tolist(),
                "completion_ids": rng.integers(2, 16, size=clen).tolist(),
                "logprobs": (-rng.random(clen) * 3).tolist(),
                "loss_mask": [1] * clen,
                "advantage": float(rng.normal()),
                "prompt_index": i // 4,
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from rl_core.config import ModelSection, TrainSection
    from rl_core.model import build_model
    from rl_core.ppo import make_batch
    from rl_core.train_engine import make_train_engine

    torch.use_deterministic_algorithms(True)

    class _Tok:  # the model needs only sizes and special ids
        eos_token_id, pad_token_id = 0, 1

        def __len__(self) -> int:
            return 16

    mcfg = ModelSection(
        hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=32, max_position=32
    )
    tcfg = TrainSection(zero_stage=args.zero_stage, lr=1e-3, micro_batch_size=16, epochs=1)
    model = build_model(mcfg, _Tok(), seed=0)
    engine = make_train_engine("deepspeed", model, tcfg)
    losses = []
    for step in range(args.steps):
        batch = make_batch(synthetic_batch(16, seed=step), pad_id=1, seed=step)
        losses.append(engine.train(batch)["loss"])
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps({"world_size": dist.get_world_size(), "losses": losses}))
    dist.barrier()


if __name__ == "__main__":
    main()
