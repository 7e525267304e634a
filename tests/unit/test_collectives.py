"""Collectives on the backend's device (issue 43, item 2): NCCL serves CUDA tensors only, so the trainer's
all-reduce builds its tensor where ``comm_device`` says; a tensor collective called anywhere else in the
library is a test failure (found in the source), so no CPU tensor reaches NCCL unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

from rl_core.training import collectives
from rl_core.training.collectives import allreduce_sum, comm_device

ROOT = Path(__file__).resolve().parents[2]


def test_nccl_gets_this_ranks_gpu_and_gloo_the_cpu(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert comm_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert comm_device() == torch.device("cpu")


def test_the_all_reduce_tensor_is_built_on_the_groups_device(monkeypatch):
    """The tensor handed to ``all_reduce`` is on ``comm_device(group)``: with NCCL's device (here the meta
    device stands in for a GPU) a CPU tensor fails the test, as it would fail NCCL."""
    seen = []

    def all_reduce(t, group=None):
        if t.device != torch.device("meta"):
            raise RuntimeError(f"a tensor on {t.device} given to a group that serves meta")
        seen.append((t.dtype, tuple(t.shape), group))

    monkeypatch.setattr(collectives, "comm_device", lambda group=None: torch.device("meta"))
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: [0.0] * self.numel())
    assert allreduce_sum([1.0, 2.0, 3.0], 2, group="dp") == [0.0, 0.0, 0.0]
    assert seen == [(torch.float64, (3,), "dp")]
    assert allreduce_sum([1.0], 1) == [1.0]  # one rank: no collective


def test_gloo_sums_over_a_real_group():
    mine = not dist.is_initialized()  # a world of one of this process's own, or the one already up
    if mine:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert comm_device() == torch.device("cpu")
        assert allreduce_sum([1.5, 2.0], 2) == [1.5, 2.0]  # world_size 2 asked: the collective runs
    finally:
        if mine:
            dist.destroy_process_group()


def test_no_tensor_collective_outside_the_helper():
    called = re.compile(
        r"\bdist\.(all_reduce|broadcast|all_gather|all_gather_into_tensor|reduce_scatter|"
        r"reduce_scatter_tensor|reduce|gather|scatter|send|recv|isend|irecv)\("
    )
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "rl_core").rglob("*.py"))
        if p.name != "collectives.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if called.search(line)
    ]
    assert not found, f"tensor collectives outside rl_core/training/collectives.py: {found}"
