"""Data-parallel checks on a synthetic RL batch: the same policy update on 1 or N DeepSpeed ranks gives the
same losses, and a run stopped after some optimizer steps continues from its stored weights and optimizer
state — bit for bit at the same layout, within float32 rounding at another world size.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 -m rl_core.training.dp_check --zero-stage 2 --out
    losses.json # resume matrix: every ZeRO stage, state stored after 2 of 4 steps, then continued from
    another world's torchrun --nproc_per_node=1 -m rl_core.training.dp_check --zero-stage 0 1 2 3 --steps 4
    --resume-at 2 \\
        --save one/ --out one.json
    torchrun --nproc_per_node=2 -m rl_core.training.dp_check --zero-stage 0 1 2 3 --steps 4 --resume-at 2 \\
        --save two/ --load one/ --out two.json
    torchrun --nproc_per_node=1 -m rl_core.training.dp_check --zero-stage 0 1 2 3 --steps 4 --resume-at 2 \\
        --save back/ --load two/ --only-load --reference one/ --out back.json

Every rank builds the same tiny model and synthetic RL batch from fixed seeds; ``ppo_update`` splits each
mini-batch over the ranks and normalises by the global token count, so the losses must match a single process.
With ``--resume-at K`` each stage is also run as a resume does it (``rl_core.training.train``): a new engine
built from the weights and world-size-free optimizer state (``rl_core.training.zero_state``) stored after step
K; with ``--load`` from the state another world size stored (``--only-load``: only that, against
``--reference``'s uninterrupted run), and once per job without any optimizer state (the control that shows a
lost state is visible). The output, per stage: the uninterrupted losses, whether the resumed run matched them
and the final weights bit for bit, and the largest gaps of the other two."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

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


class _Tok:  # the model needs only sizes and special ids
    eos_token_id, pad_token_id = 0, 1

    def __len__(self) -> int:
        return 16


def _engine(stage: int, weights: dict[str, Any] | None = None) -> Any:
    from rl_core.models.model import build_model
    from rl_core.schema.config import ModelSection, TrainSection
    from rl_core.training.train_engine import make_train_engine

    mcfg = ModelSection(
        hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=32, max_position=32
    )
    tcfg = TrainSection(zero_stage=stage, lr=1e-3, micro_batch_size=16, epochs=1)
    model = build_model(mcfg, _Tok(), seed=0)
    if weights is not None:
        model.load_state_dict(weights)
    return make_train_engine("deepspeed", model, tcfg)


def _steps(engine: Any, first: int, last: int) -> list[float]:
    from rl_core.training.ppo import make_batch

    batches = [make_batch(synthetic_batch(16, seed=s), pad_id=1, seed=s) for s in range(first, last)]
    return [engine.train(b)["loss"] for b in batches]


def _sha(weights: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode() + weights[k].float().numpy().tobytes())
    return h.hexdigest()


def _gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _resumed(stage: int, saved: Path, first: int, last: int, with_state: bool = True) -> tuple[list, Any]:
    """Continue from the weights (and optimizer state) stored in ``saved``: its losses and final weights."""
    from safetensors.torch import load_file

    engine = _engine(stage, load_file(str(saved / "model.safetensors")))
    if with_state:
        engine.load_optimizer_state((saved / "optimizer.safetensors").read_bytes(), str(saved))
    losses = _steps(engine, first, last)
    return losses, engine.full_weights()


def _own_run(stage: int, args: argparse.Namespace, mine: Path) -> dict[str, Any]:
    """The uninterrupted run of ``stage``, its state stored after step K and its final weights and losses
    (for a later job's comparison), then the resume from that state (and once, the control without it)."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    k, n = args.resume_at, args.steps
    engine = _engine(stage)
    losses = _steps(engine, 0, k)
    weights, state = engine.full_weights(), engine.optimizer_state()
    if dist.get_rank() == 0:
        mine.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(mine / "model.safetensors"))
        (mine / "optimizer.safetensors").write_bytes(state)
    dist.barrier()
    losses += _steps(engine, k, n)
    final = engine.full_weights()
    if dist.get_rank() == 0:
        save_file(final, str(mine / "final.safetensors"))
        (mine / "losses.json").write_text(json.dumps(losses))
    out: dict[str, Any] = {"losses": losses}
    resumed, w = _resumed(stage, mine, k, n)
    if dist.get_rank() == 0:
        out |= {"resumed_identical": resumed == losses[k:] and _sha(w) == _sha(final)}
    if stage == args.zero_stage[0]:  # the control, once per job: a lost state is far outside the tolerance
        _, w = _resumed(stage, mine, k, n, with_state=False)
        if dist.get_rank() == 0:
            out |= {"no_state_weight_gap": _gap(w, final)}
    return out


def _resume_matrix(stage: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist
    from safetensors.torch import load_file

    k, n = args.resume_at, args.steps
    mine = args.save / f"zero{stage}"
    out = {} if args.only_load else _own_run(stage, args, mine)
    if args.load is not None:
        other, w = _resumed(stage, args.load / f"zero{stage}", k, n)
        if (
            dist.get_rank() == 0
        ):  # against the uninterrupted run of this world size (this job's or --reference's)
            ref = mine if not args.only_load else args.reference / f"zero{stage}"
            final, losses = (
                load_file(str(ref / "final.safetensors")),
                json.loads((ref / "losses.json").read_text()),
            )
            gaps = [abs(a - b) for a, b in zip(other, losses[k:], strict=True)]
            out |= {"from_other_loss_gap": max(gaps), "from_other_weight_gap": _gap(w, final)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zero-stage", type=int, nargs="+", default=[2])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--resume-at", type=int, default=None, help="store the state after this many steps")
    ap.add_argument("--save", type=Path, help="with --resume-at: where each stage's state is stored")
    ap.add_argument("--load", type=Path, help="with --resume-at: states another world size stored")
    ap.add_argument("--only-load", action="store_true", help="only continue from --load's states")
    ap.add_argument("--reference", type=Path, help="with --only-load: this world size's earlier --save")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.resume_at is not None and (args.save is None or not 0 < args.resume_at < args.steps):
        ap.error("--resume-at K needs --save DIR and 0 < K < --steps")
    if args.only_load and (args.load is None or args.reference is None):
        ap.error("--only-load needs --load and --reference")

    import torch
    import torch.distributed as dist

    torch.use_deterministic_algorithms(True)
    result: dict[str, Any] = {}
    for stage in args.zero_stage:
        if args.resume_at is None:
            result[str(stage)] = {"losses": _steps(_engine(stage), 0, args.steps)}
        else:
            result[str(stage)] = _resume_matrix(stage, args)
    if dist.get_rank() == 0:
        first = result[str(args.zero_stage[0])]
        args.out.write_text(json.dumps({"world_size": dist.get_world_size(), **first, "stages": result}))
    dist.barrier()


if __name__ == "__main__":
    main()
