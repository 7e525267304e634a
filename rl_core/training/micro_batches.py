"""What one train forward holds: a rank's share of a mini-batch (one optimizer step) split into micro-batches
whose gradients are accumulated, so that the optimizer batch is chosen for learning and the forward for the
device's memory (verl's dynamic batch size by tokens per GPU, in this project's terms).

    groups = rank_micro_batches(mini_batch_rows, costs, world=4, rank=1, tokens=16384, sequences=None)

Every rank computes every rank's split (each holds the whole batch), so all ranks run the same number of
forwards and backwards (ZeRO-2/3 reduce or gather in each; a rank with fewer groups than the most loaded one
gets empty ones, which the update runs as zero-weight forwards). The split is a function of the rows and the
budget alone: a replay splits alike.
"""

from __future__ import annotations

import torch


def split(rows: list[int], costs: list[int], tokens: int | None, sequences: int | None) -> list[list[int]]:
    """``rows`` in order, cut where the next row would take a group past ``tokens`` (the sum of its rows'
    costs) or ``sequences`` rows; a row costlier than ``tokens`` gets a group of its own.

    >>> split([0, 1, 2, 3, 4], [4, 4, 4, 9, 1], tokens=8, sequences=None)
    [[0, 1], [2], [3], [4]]
    >>> split([0, 1, 2, 3, 4], [4, 4, 4, 9, 1], tokens=None, sequences=2), split([0, 1], [3, 3], None, None)
    ([[0, 1], [2, 3], [4]], [[0, 1]])
    """
    groups: list[list[int]] = []
    held = 0
    for row, cost in zip(rows, costs, strict=True):
        full = bool(groups) and (
            (tokens is not None and held + cost > tokens)
            or (sequences is not None and len(groups[-1]) >= sequences)
        )
        if not groups or full:
            groups.append([])
            held = 0
        groups[-1].append(row)
        held += cost
    return groups


def rank_micro_batches(
    mini_batch: torch.Tensor,
    costs: torch.Tensor,
    world: int,
    rank: int,
    tokens: int | None,
    sequences: int | None,
) -> list[torch.Tensor]:
    """Rank ``rank``'s micro-batches of ``mini_batch`` (row indices; the rank's share is every ``world``-th
    row from ``rank``), as many as the most loaded rank has: empty ones at the end where this rank needs
    fewer. ``costs``: each row's tokens in a forward, indexed by row. One group of the whole share when there
    is no bound."""
    shares = [mini_batch[r::world].tolist() for r in range(world)]
    if tokens is None and sequences is None:
        return [mini_batch[rank::world]]
    every = [split(s, costs[s].tolist(), tokens, sequences) for s in shares]
    count = max(len(g) for g in every)
    mine = every[rank] + [[] for _ in range(count - len(every[rank]))]
    return [torch.tensor(g, dtype=torch.long) for g in mine]
