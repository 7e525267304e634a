"""``logits_stats`` (rl_core/training/logprobs.py): the taken tokens' logprobs, the entropies and the
gradients are bit for bit those of the separate steps it replaces (``suppress``, ``token_logprobs``,
``entropy_from_logits``), in float32 and bf16, at temperature 1 and not, with and without suppressed ids, on
contiguous logits and on the ``[:, :-1]`` view the trainer takes; and a caller's logits are left alone unless
it hands them over (``own``)."""

from __future__ import annotations

import pytest
import torch

from rl_core.models.vision import suppress
from rl_core.training.logprobs import logits_stats
from rl_core.training.losses import entropy_from_logits, token_logprobs

VOCAB = 97


def _separate(logits: torch.Tensor, targets: torch.Tensor, temperature: float, never: list[int]):
    """The steps the trainer took before ``logits_stats``: two log-softmaxes and the copies between."""
    x = suppress(logits, never)
    return token_logprobs(x, targets, temperature), entropy_from_logits(x, temperature).detach()


def _case(dtype: torch.dtype, view: bool) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    head = torch.nn.Linear(16, VOCAB, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, 16, generator=g) * 2)
    hidden = torch.randn(3, 6 if view else 5, 16, generator=g).to(dtype)
    targets = torch.randint(0, VOCAB, (3, 5), generator=g)
    return head, hidden, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("never", [[], [2, 40]])
@pytest.mark.parametrize("view", [False, True])
def test_values_and_gradients_are_the_separate_steps_bit_for_bit(dtype, temperature, never, view):
    got = []
    for fused in (False, True):
        head, hidden, targets = _case(dtype, view)
        logits = head(hidden)
        logits = logits[:, :-1] if view else logits
        if fused:  # the head's output: a Linear keeps its input for the backward, so it may be written into
            lp, ent = logits_stats(logits, targets, temperature, never, entropy=True, own=not view)
        else:
            lp, ent = _separate(logits, targets, temperature, never)
        weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)
        (lp * weights).sum().backward()
        got.append((lp.detach(), ent, head.weight.grad.clone()))
    (lp0, ent0, g0), (lp1, ent1, g1) = got
    assert torch.equal(lp0, lp1)
    assert torch.equal(ent0, ent1)
    assert torch.equal(g0, g1)
    assert torch.isfinite(ent1).all() and not ent1.requires_grad


@pytest.mark.parametrize("never", [[], [3]])
def test_a_callers_logits_are_left_alone_unless_handed_over(never):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    targets = torch.tensor([0, 1, 2, 5])
    lp, _ = logits_stats(logits, targets, 0.5, never, own=False)
    assert torch.equal(logits, before)
    lp_own, ent = logits_stats(logits, targets, 0.5, never, own=True)
    assert ent is None
    assert torch.equal(lp, lp_own)
    assert not torch.equal(logits, before)  # handed over: the temperature was written into it


def test_without_grad_the_anchor_path_matches_and_writes_into_its_own_logits():
    head, hidden, targets = _case(torch.float32, view=True)
    with torch.no_grad():
        logits = head(hidden)
        want = _separate(logits[:, :-1], targets, 0.9, [4])
        got = logits_stats(logits[:, :-1], targets, 0.9, [4], entropy=True, own=True)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    assert float(logits[0, 0, 4]) < -1e8  # the suppression went into the model's own tensor: no copy
