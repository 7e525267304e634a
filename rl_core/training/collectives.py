"""The trainer's own collectives, each tensor on the device the process group's backend serves: NCCL takes
CUDA tensors only (a CPU tensor fails the first multi-GPU update), gloo CPU ones. DeepSpeed's collectives
are its own; the object collectives (``all_gather_object``) place their buffers themselves.

    sums = allreduce_sum([loss, tokens], world_size, group)   # a sum over the data-parallel ranks
"""

from __future__ import annotations

from typing import Any

import torch


def comm_device(group: Any = None) -> torch.device:
    """Where a tensor for ``group``'s collectives must live: this rank's current GPU under NCCL, else the
    CPU."""
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def allreduce_sum(values: list[float], world_size: int, group: Any = None) -> list[float]:
    """``values`` summed over the ranks of ``group`` (every rank when None) in float64; as given at one
    rank."""
    if world_size == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=comm_device(group))
    dist.all_reduce(t, group=group)
    return t.tolist()
