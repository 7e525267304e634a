"""What an audit of the RL maths found, each checked numerically: dropout left on in training (on-policy
ratios were noise), an unscored completion trained as reward 0 under PPO, DAPO's overlong penalty counting a
multi-turn episode's every turn against the per-turn cap, and k1 accepted as a KL loss (zero gradient)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.schema.config import ConfigError, load_config
from rl_core.training.algorithms import longest_turn, overlong_penalty
from rl_core.training.critic import gae, ppo_targets, terminal_rewards
from rl_core.training.train_engine import make_train_engine


def test_the_trainer_runs_without_dropout():
    """A GPT-2 folder's 0.1 dropout made two forwards of the same policy give a token different
    logprobs: the ratio at the first, on-policy step was not 1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    assert model.config.resid_pdrop == 0.1
    ids = torch.randint(0, 64, (4, 16))
    model.train()
    noisy = [model(input_ids=ids).logits for _ in range(2)]
    assert not torch.equal(noisy[0], noisy[1])  # as it came
    engine = make_train_engine("torch", model, load_config("configs/smoke.yaml").train)
    assert engine.module.training
    a, b = (engine.module(input_ids=ids).logits for _ in range(2))
    assert torch.equal(a, b)


def test_an_unscored_completion_moves_neither_the_policy_nor_the_critic():
    """Reward NaN (an infra failure, every judge abstaining): GRPO gives it advantage 0; PPO trained it as
    reward 0 (advantages -0.54..-0.6 at V=0.6, the critic fitted toward 0 on it)."""
    cfg = type("C", (), {"kl_coef": 0.0, "gamma": 1.0, "lam": 0.95})
    reward = np.array([1.0, np.nan, 0.0, 1.0])
    mask = torch.ones(4, 3)
    values = torch.full((4, 3), 0.6)
    adv, returns, fitted = ppo_targets(reward, values, mask, None, cfg)
    assert torch.equal(adv[1], torch.zeros(3)) and torch.equal(fitted[1], torch.zeros(3))
    assert torch.equal(fitted[[0, 2, 3]], torch.ones(3, 3))
    scored = [0, 2, 3]  # the others: exactly GAE on their own rewards
    want, want_returns = gae(
        terminal_rewards(reward[scored], mask[scored]), values[scored], mask[scored], 1.0, 0.95
    )
    assert torch.equal(adv[scored], want) and torch.equal(returns[scored], want_returns)
    assert (adv[0] > 0).all() and (adv[2] < 0).all()


def test_the_overlong_penalty_reads_the_longest_turn():
    """Three correct tool-use episodes, every turn at most 7 tokens under a 16-token cap per turn: their
    totals (15, 14, 6) drew penalties -0.75, -0.5, 0."""
    masks = [
        [1] * 5 + [0] * 9 + [1] * 5 + [0] * 9 + [1] * 5,
        [1] * 7 + [0] * 9 + [1] * 7,
        [1] * 6,
    ]
    lengths = np.array([longest_turn(m) for m in masks])
    assert lengths.tolist() == [5, 7, 6]
    assert overlong_penalty(lengths, max_tokens=16, cache=4).tolist() == [0.0, 0.0, 0.0]
    assert overlong_penalty(np.array([longest_turn([1] * 15)]), 16, 4).tolist() == [-0.75]  # single-turn


def test_k1_is_refused_as_a_kl_loss_and_kept_in_the_reward():
    with pytest.raises(ConfigError, match="k1 as a loss regularises nothing"):
        load_config("configs/smoke.yaml", ["train.kl_coef=0.05", "train.kl_estimator=k1"])
    cfg = load_config(
        "configs/smoke.yaml", ["train.kl_coef=0.05", "train.kl_estimator=k1", "train.kl_in=reward"]
    )
    assert cfg.train.kl_estimator == "k1"
    assert (
        load_config("configs/smoke.yaml", ["train.kl_coef=0.05", "train.kl_estimator=k2"]).train.kl_coef
        == 0.05
    )
