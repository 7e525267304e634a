"""The DeepSpeed train engine at one rank (ZeRO-0, float32: own clipping, no all-reduce), in-process."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from rl_core.artifacts.safe_state import loads
from rl_core.training.train_engine import make_train_engine


class _TwoHeads(torch.nn.Module):
    """``unused`` takes no part in the loss, as a LLaVA vision tower's last layer."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _cfg() -> SimpleNamespace:
    return SimpleNamespace(
        lr=0.1, weight_decay=0.5, grad_clip=1.0, zero_stage=0, tp_size=1, micro_batch_size=4, dtype="fp32"
    )


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch):
    import torch.distributed as dist

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    if dist.is_initialized():  # a world an earlier test of this worker process left (its flow's trainer)
        from deepspeed.utils import groups

        dist.destroy_process_group()
        groups._WORLD_GROUP = None
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)


def test_a_parameter_the_loss_does_not_reach_still_steps_and_has_optimizer_state(one_rank):
    torch.manual_seed(0)
    model = _TwoHeads()
    before = model.unused.weight.detach().clone()
    engine = make_train_engine("deepspeed", model, _cfg())
    try:
        assert engine.own_clip and not engine.engine.enable_backward_allreduce
        loss = engine.module(torch.ones(2, 4)).pow(2).sum()
        norm = engine.backward_step(loss)
        assert norm > 0
        # As DeepSpeed's all-reduce does at any world size: a zero gradient, so AdamW's weight decay applies.
        after = engine.module.module.unused.weight.detach()
        torch.testing.assert_close(after, before * (1 - 0.1 * 0.5))
        state = loads(engine.optimizer_state(), "test state")
        assert state["step"] == 1
        assert set(state["exp_avg"]) == {n for n, _ in model.named_parameters()}
        assert not state["exp_avg"]["unused.weight"].any()
        assert state["exp_avg"]["used.weight"].abs().sum() > 0
    finally:
        engine.close()
