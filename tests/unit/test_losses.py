"""Advantages, clipped loss and KL estimators against values computed by hand."""

import math

import numpy as np
import pytest
import torch

from rl_core.training.losses import aggregate, clipped_pg_loss, group_advantages, kl_estimate


def test_grpo_advantage_hand_computed():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +-1 (eps aside)
    # group 1: 2, 2 -> std 0 -> 0
    adv = group_advantages(
        np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), np.array([0, 0, 0, 0, 1, 1]), eps=0.0 + 1e-12
    )
    np.testing.assert_allclose(adv, [1, -1, -1, 1, 0, 0], atol=1e-9)


def test_grpo_advantage_uneven_group():
    r = np.array([3.0, 0.0, 0.0])  # mean 1, std sqrt(2)
    adv = group_advantages(r, np.array([7, 7, 7]), eps=1e-6)
    s = math.sqrt(2.0)
    np.testing.assert_allclose(adv, [2 / (s + 1e-6), -1 / (s + 1e-6), -1 / (s + 1e-6)], rtol=1e-9)


def test_drgrpo_advantage_has_no_std_scaling():
    adv = group_advantages(np.array([3.0, 0.0, 0.0, 5.0, 1.0]), np.array([0, 0, 0, 1, 1]), scale_by_std=False)
    np.testing.assert_allclose(adv, [2, -1, -1, 2, -2])


def test_clipped_loss_hand_computed_token_mean():
    # two sequences, two loss tokens each, one padded position in the second
    logp = torch.tensor([[math.log(1.5), math.log(0.5)], [math.log(1.1), 0.0]])
    old = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = clipped_pg_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # seq0 tok0: ratio 1.5, A=1: max(-1.5, -1.2) = -1.2 (clipped)
    # seq0 tok1: ratio 0.5, A=1: max(-0.5, -0.8) = -0.5 (unclipped)
    # seq1 tok0: ratio 1.1, A=-2: max(2.2, 2.2) = 2.2
    expected = (-1.2 - 0.5 + 2.2) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3, abs=1e-6)


def test_clip_higher_asymmetric():
    logp = torch.tensor([[math.log(1.25)]])
    loss, _ = clipped_pg_loss(
        logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    assert loss.item() == pytest.approx(-1.25, abs=1e-6)  # inside the raised upper bound: not clipped


def test_aggregations_hand_computed():
    x = torch.tensor([[1.0, 3.0, 0.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, m, "token_mean").item() == pytest.approx(8 / 3)
    assert aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(x, m, "seq_mean_token_sum_norm", max_tokens=4).item() == pytest.approx(
        (4 / 4 + 4 / 4) / 2
    )
    assert aggregate(x, m, "token_mean", total=6.0).item() == pytest.approx(8 / 6)


def test_kl_estimators_hand_computed():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    r = 0.25 / 0.5  # ref / pi
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-math.log(r))
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(r) ** 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(r - 1 - math.log(r))
    assert kl_estimate(ref, ref, "k3").item() == 0.0


def test_kl_term_added_to_loss():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    base, _ = clipped_pg_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1))
    with_kl, stats = clipped_pg_loss(
        logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1), ref_logp=ref, kl_coef=0.1
    )
    k3 = 0.5 - 1 - math.log(0.5)
    assert stats["kl"] == pytest.approx(k3, abs=1e-6)
    assert (with_kl - base).item() == pytest.approx(0.1 * k3, abs=1e-6)
