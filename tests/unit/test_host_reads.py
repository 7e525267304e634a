"""The PPO update reads nothing back from the device between micro-batches (issue 38: no host
synchronisation inside the micro-batch loop). On a GPU, reading a tensor's value (``float``, ``item``,
``tolist``, ``cpu``, a truth test) or copying a host tensor to it without ``non_blocking`` waits for every
kernel queued there; the loop would then stall the device once per micro-batch.

Here, on the CPU, every such call made by rlfoundry's own code during ``ppo_update`` on a floating-point or
boolean tensor (what a device computes; the row indices and token counts the loop plans with are the host's
own integers) is recorded with its place: the same update cut into many micro-batches must read at exactly
the places, and as often, as when it runs in one (the statistics are read once a mini-batch has stepped, the
anchor's observations once the update is done), and every copy to the trainer's device is non-blocking."""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from rl_core.schema.config import load_config
from rl_core.training.ppo import make_batch, ppo_update
from rl_core.training.train_engine import TorchTrainEngine
from tests.unit.test_packing import _frame, _policy

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


def _ours(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return f"{name}:{frame.f_lineno}" if name.startswith("rl_core.") else None


def _record(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter, list[str]]:
    reads: Counter = Counter()
    blocking: list[str] = []
    for method in READS:
        real = getattr(torch.Tensor, method)

        def spy(self, *a, _real=real, **k):
            where = _ours(sys._getframe(1))
            if where and (self.is_floating_point() or self.dtype == torch.bool):
                reads[where] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, method, spy)
    real_to = torch.Tensor.to

    def to(self, *a, **k):
        where = _ours(sys._getframe(1))
        moves = any(isinstance(x, (str, torch.device)) for x in a) or "device" in k
        if where and moves and not k.get("non_blocking"):
            blocking.append(where)
        return real_to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", to)
    return reads, blocking


def _update(pieces: int | None, pack: int | None, old: str, chunk_mb: float):
    cfg = load_config("configs/smoke.yaml").train.model_copy(
        update={"micro_batch_size": 8, "epochs": 2, "old_logprobs": old, "forward_sequences": pieces}
    )
    model = _policy().train()
    engine = TorchTrainEngine(model, cfg)
    batch = make_batch(_frame(), pad_id=1, pack_tokens=pack, logits_mb=chunk_mb)
    forwards = []  # a backward per micro-batch
    real = engine.backward_step
    engine.backward_step = lambda loss, step=True: forwards.append(step) or real(loss, step)
    with pytest.MonkeyPatch.context() as monkeypatch:  # the spies live for this update only
        reads, blocking = _record(monkeypatch)
        out = ppo_update(engine, batch, cfg)
    return SimpleNamespace(reads=reads, blocking=blocking, forwards=len(forwards), out=out)


@pytest.mark.parametrize("pack", [None, 16])
@pytest.mark.parametrize("old", ["engine", "recompute"])
@pytest.mark.parametrize("chunk_mb", [0.0, 1e-4])
def test_more_micro_batches_read_nothing_more_from_the_device(pack, old, chunk_mb):
    whole = _update(None, pack, old, chunk_mb)
    cut = _update(1, pack, old, chunk_mb)  # a micro-batch a sequence
    assert cut.forwards > whole.forwards  # the same update, in more pieces
    assert cut.out["loss"] == pytest.approx(whole.out["loss"], abs=1e-5)
    assert cut.reads == whole.reads, sorted((cut.reads - whole.reads).items())
    assert not cut.blocking and not whole.blocking, cut.blocking
