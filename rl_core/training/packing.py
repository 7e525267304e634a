"""Sequence packing for the trainer's forward passes (``train.packing``).

A right-padded mini-batch ``[B, T]`` spends part of its forward on padding: with multi-turn tool-use
rollouts, a quarter (after the warm-up of configs/tooluse.yaml) to a half (an earlier policy) of it. Packing
trims each sequence to its real length and packs the sequences, first-fit decreasing, into rows of at most
``budget`` tokens (a sequence longer than the budget gets a row of its own). Positions restart at 0 at each
sequence and attention stays inside it: the rows go to the model with those ``position_ids`` and no
attention mask, which transformers 5 (5.19 here; tests/unit/test_packing.py pins it) reads as packed
sequences and turns into a block-diagonal causal mask for sdpa and eager attention, and into variable-length
kernels for flash attention. The logits come back in the padded ``[B, T-1, V]`` layout (zeros after each
sequence's end), so the loss, the loss mask (observation tokens of multi-turn episodes stay masked) and every
metric downstream are unchanged.

    plan = pack_plan([7, 3, 5], budget=8)    # rows [[0], [2, 1]]
    logits = packed_logits(model, ids, attention_mask, budget=8)  # ~ model(ids, attention_mask).logits

Vision-language batches (``pixel_values``) are refused: their image tokens are expanded inside the model,
so the lengths seen here are not the lengths the model packs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PackPlan:
    """Where each sequence of a batch sits in the packed rows."""

    rows: list[list[int]]  # per packed row, the batch indices it holds, left to right
    lengths: list[int]  # per sequence, its real length (tokens)
    width: int  # length of the packed rows (the longest row)

    def offsets(self) -> list[tuple[int, int]]:
        """Per sequence (batch order), its (row, start column)."""
        where: dict[int, tuple[int, int]] = {}
        for r, row in enumerate(self.rows):
            col = 0
            for i in row:
                where[i] = (r, col)
                col += self.lengths[i]
        return [where[i] for i in range(len(self.lengths))]


def pack_plan(lengths: Sequence[int], budget: int) -> PackPlan:
    """First-fit decreasing: sequences longest first (ties by batch index, so the plan is deterministic),
    each into the first row with room for it; a sequence longer than ``budget`` gets a row of its own.

    >>> pack_plan([2, 5, 3, 4], budget=7).rows
    [[1, 0], [3, 2]]
    """
    if budget < 1:
        raise ValueError(f"packing budget must be >= 1 token, got {budget}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = int(lengths[i])
        r = next((r for r, free in enumerate(room) if n <= free), None)
        if r is None:
            rows.append([i])
            room.append(budget - n)
        else:
            rows[r].append(i)
            room[r] -= n
    used = [sum(int(lengths[i]) for i in row) for row in rows]
    return PackPlan(rows, [int(n) for n in lengths], max(used, default=0))


def position_ids(plan: PackPlan) -> torch.Tensor:
    """``[rows, width]`` positions: 0.. at each sequence, and 0.. again over a row's trailing padding (a
    segment of its own, so that no real token sees it and no padding row is fully masked).

    >>> position_ids(PackPlan([[1, 0], [2]], [2, 3, 4], 5)).tolist()
    [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    """
    pos = torch.zeros((len(plan.rows), plan.width), dtype=torch.long)
    for r, row in enumerate(plan.rows):
        col = 0
        for n in [plan.lengths[i] for i in row] + [plan.width - sum(plan.lengths[i] for i in row)]:
            pos[r, col : col + n] = torch.arange(n)
            col += n
    return pos


def block_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """``[rows, width, width]`` booleans, True where query q may attend to key k: k <= q inside the same
    segment, a segment starting wherever the position does not follow on (what transformers derives).

    >>> block_causal_mask(torch.tensor([[0, 1, 0]])).int().tolist()
    [[[1, 0, 0], [1, 1, 0], [0, 0, 1]]]
    """
    first = positions[:, :1] - 1
    seg = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
    same = seg.unsqueeze(-1) == seg.unsqueeze(-2)
    width = positions.shape[-1]
    return same & torch.ones(width, width, dtype=torch.bool).tril()


def _flat_index(plan: PackPlan, targets: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Matching flat indices: the packed logits ``row * width + col`` that predict a next token of the same
    sequence, and their places ``i * targets + t`` in the padded ``[B, targets]`` layout."""
    src, dst = [], []
    for i, (r, col) in enumerate(plan.offsets()):
        n = plan.lengths[i] - 1  # the last token predicts past the sequence: dropped, as when padded
        src.append(torch.arange(n) + r * plan.width + col)
        dst.append(torch.arange(n) + i * targets)
    # host indices to the device without waiting for its queue
    return torch.cat(src).to(device, non_blocking=True), torch.cat(dst).to(device, non_blocking=True)


def _lengths(attn: torch.Tensor) -> list[int]:
    lengths = attn.sum(1)
    prefix = torch.arange(attn.shape[1], device=attn.device) < lengths.unsqueeze(1)
    if not torch.equal(attn.bool(), prefix) or int(lengths.min()) < 1:
        raise ValueError("packing needs right-padded sequences of at least one token each")
    return [int(n) for n in lengths]


def pack(
    ids: torch.Tensor, attn: torch.Tensor, budget: int, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor, PackPlan]:
    """The packed ``[rows, width]`` input ids and positions of a right-padded batch, and their plan, on
    ``device`` (default: the batch's); ``budget`` 0 means the batch's longest sequence (never more tokens per
    row than padding would have). Laid out on the host: a batch on the host (the trainer passes its own
    copy) is read nowhere else, and its packed rows go to the device without waiting for its queue."""
    device = ids.device if device is None else device
    ids, attn = ids.cpu(), attn.cpu()
    lengths = _lengths(attn)
    plan = pack_plan(lengths, budget or max(lengths))
    packed = torch.zeros((len(plan.rows), plan.width), dtype=ids.dtype)
    for i, (r, col) in enumerate(plan.offsets()):
        packed[r, col : col + lengths[i]] = ids[i, : lengths[i]]
    pos = position_ids(plan)
    return packed.to(device, non_blocking=True), pos.to(device, non_blocking=True), plan


def packed_logits(
    module: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    budget: int,
    pixels: dict[str, Any] | None = None,
    device: Any = None,
) -> torch.Tensor:
    """``module``'s next-token logits of the right-padded batch ``ids`` (``[B, T]``, real tokens where
    ``attn`` is 1), computed on packed rows (on ``device``, default the batch's) and returned as
    ``[B, T-1, V]`` like the padded forward's ``logits[:, :-1]``, zeros past each sequence's end.
    Differentiable."""
    if pixels is not None:
        raise ValueError(
            "train.packing does not pack vision-language batches (pixel_values): set train.packing=false"
        )
    return packed_outputs(lambda **kw: module(**kw).logits, ids, attn, budget, device)


def packed_outputs(
    run: Any, ids: torch.Tensor, attn: torch.Tensor, budget: int, device: Any = None
) -> torch.Tensor:
    """What ``run(input_ids=, position_ids=, attention_mask=None, use_cache=False)`` gives per position
    (``[rows, width, X]``: a causal LM's logits, or its base model's last hidden states) on the packed rows
    of the right-padded batch ``ids``, returned as ``[B, T-1, X]`` aligned with the next-token targets,
    zeros past each sequence's end. Differentiable."""
    packed, pos, plan = pack(ids, attn, budget, device)
    out = run(input_ids=packed, position_ids=pos, attention_mask=None, use_cache=False)
    b, t = ids.shape
    src, dst = _flat_index(plan, t - 1, out.device)
    flat = out.reshape(-1, out.shape[-1]).index_select(0, src)
    return flat.new_zeros((b * (t - 1), flat.shape[-1])).index_copy(0, dst, flat).view(b, t - 1, -1)


def padding_fraction(lengths: Sequence[int], rows: int, width: int) -> float:
    """Share of a ``[rows, width]`` forward spent on padding.

    >>> padding_fraction([3, 1], rows=2, width=4)
    0.5
    """
    return 1.0 - sum(lengths) / max(rows * width, 1)


def pack_budget(train_cfg: Any) -> int | None:
    """A batch's ``pack_tokens`` under the ``train`` config section: None (padded forwards) unless
    ``train.packing``, else ``train.pack_tokens`` (0: each mini-batch's longest sequence)."""
    return int(train_cfg.pack_tokens) if train_cfg.packing else None
