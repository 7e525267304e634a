"""The policy-gradient family (rl_core/training/algorithms.py, rl_core/training/losses.py,
rl_core/training/critic.py) against values worked out by hand in the comments; GSPO's sequence ratio split
over ranks; a new algorithm registered in a
test runs through the unchanged PPO loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rl_core.schema.config import ConfigError, load_config
from rl_core.schema.config_pg import ALGORITHM_TRAITS
from rl_core.training.algorithms import (
    ALGORITHMS,
    given_advantages,
    kl_in_reward,
    overlong_penalty,
    register,
    rloo,
    score,
    train_rows,
    zero_std_groups,
)
from rl_core.training.critic import gae, terminal_rewards, value_loss
from rl_core.training.losses import (
    PolicyTerms,
    cispo_surrogate,
    clipped_surrogate,
    gspo_surrogate,
    policy_loss,
)
from rl_core.training.ppo import make_batch, ppo_update
from tests.unit.test_anchor import COMPLETIONS, PROMPTS, Engine


def _cfg(*sets: str):
    return load_config("configs/smoke.yaml", list(sets))


def test_every_algorithm_is_one_config_choice():
    assert sorted(ALGORITHMS) == ["cispo", "dapo", "drgrpo", "grpo", "gspo", "ppo", "rloo"]
    for name in ALGORITHMS:
        assert _cfg(f"train.algorithm={name}").train.algorithm == name
    # unset options take the algorithm's own; an explicit one wins
    assert (_cfg().train.clip_low, _cfg().train.clip_high, _cfg().train.loss_agg) == (0.2, 0.28, "token_mean")
    gspo = _cfg("train.algorithm=gspo").train
    assert (gspo.clip_low, gspo.clip_high, gspo.loss_agg) == (3e-4, 4e-4, "seq_mean_token_mean")
    assert _cfg("train.algorithm=drgrpo").train.loss_agg == "seq_mean_token_sum_norm"
    assert _cfg("train.algorithm=drgrpo", "train.loss_agg=token_mean").train.loss_agg == "token_mean"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["train.algorithm=ppo2"], r"train\.algorithm: 'ppo2' is not one of cispo, dapo"),
        (["train.lam=0.9"], r"train\.lam is used by train\.algorithm=ppo only"),
        (["train.algorithm=gspo", "train.loss_agg=token_mean"], r"train\.loss_agg: gspo aggregates"),
        (["train.kl_in=reward"], r"train\.kl_in=reward needs train\.kl_coef > 0"),
        (["train.algorithm=ppo", "train.checkpoint_every=2"], r"train\.checkpoint_every must be 1"),
        (["train.overlong_cache=8"], r"train\.overlong_cache: must be < rollout\.max_tokens"),
    ],
)
def test_bad_combinations_are_refused_naming_the_field(sets, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(*sets)


def test_old_reward_advantage_field_names_its_new_home(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("reward:\n  advantage: drgrpo\n")
    with pytest.raises(ConfigError, match=r"reward\.advantage moved: set train\.algorithm instead"):
        load_config(old)


def test_group_estimators_hand_computed():
    r, g = np.array([1.0, 0.0, 0.0, 1.0, 3.0]), np.array([0, 0, 0, 0, 1])
    # group 0: mean 0.5, std 0.5 -> grpo +-1 (eps 1e-6 aside), drgrpo +-0.5; the lone group 1 gets 0
    np.testing.assert_allclose(ALGORITHMS["grpo"].advantage(r, g), [1, -1, -1, 1, 0], atol=1e-5)
    np.testing.assert_allclose(ALGORITHMS["drgrpo"].advantage(r, g), [0.5, -0.5, -0.5, 0.5, 0])
    # rloo: r_0 = 1 against the others' mean (0 + 0 + 1) / 3 -> 2/3; r_1 = 0 against 2/3 -> -2/3
    np.testing.assert_allclose(rloo(r, g), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0])
    # an abstained completion (NaN) gets 0 and leaves its group: rloo over [1, 0] -> +-1
    with_nan = np.array([1.0, np.nan, 0.0])
    np.testing.assert_allclose(given_advantages(rloo, with_nan, np.zeros(3, dtype=int)), [1, 0, -1])


def test_overlong_penalty_hand_computed():
    # max_tokens 10, cache 4: free up to 6 tokens, then -0.5 per token over 6 (penalty 2 / 4 tokens)
    assert overlong_penalty(np.array([3, 6, 7, 9, 10]), 10, 4, penalty=2.0).tolist() == [0, 0, -0.5, -1.5, -2]


def test_dapo_scores_drop_flat_groups_after_overlong_shaping():
    cfg = _cfg("train.algorithm=dapo")  # max_tokens 8 -> cache 8 // 4 = 2: 7 tokens cost 0.5, 8 cost 1
    reward = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    groups = np.array([0, 0, 1, 1, 2, 2])
    lengths = np.array([8, 6, 3, 3, 5, 5])
    cols, metrics = score(cfg, reward, groups, lengths)
    # group 0: shaped [0, 1] (the 8-token answer lost 1) -> signal; group 1: [1, 0]; group 2: [0, 0] flat
    np.testing.assert_allclose(cols["reward"], [0, 1, 1, 0, 0, 0])
    assert cols["keep"].tolist() == [True, True, True, True, False, False]
    assert metrics == {"overlong_mean": -1 / 6, "dropped_groups": 1.0, "dropped_rows": 2.0}
    np.testing.assert_allclose(cols["advantage"], [-1, 1, 1, -1, 0, 0], atol=1e-5)
    assert zero_std_groups(np.array([np.nan, np.nan]), np.array([4, 4])).tolist() == [True, True]
    # the default (grpo) adds no column and no metric: the same rewards table as before the family
    cols, metrics = score(_cfg(), reward, groups, lengths)
    assert list(cols) == ["reward", "advantage"] and metrics == {}


def test_train_rows_keep_what_the_score_stage_kept_in_order():
    rollouts = pd.DataFrame({"prompt_index": [0, 0, 1, 1], "sample_index": [0, 1, 0, 1]})
    rewards = pd.DataFrame(
        {
            "reward": [1.0, 0.0, 1.0, 1.0],
            "advantage": [1.0, -1.0, 0.0, 0.0],
            "keep": [True, True, False, False],
        }
    )
    df, metrics = train_rows(rollouts, rewards)
    assert df["sample_index"].tolist() == [0, 1] and df["advantage"].tolist() == [1.0, -1.0]
    assert metrics == {"dropped_groups": 1.0, "kept_rows": 2.0}
    assert len(train_rows(rollouts, rewards.drop(columns="keep"))[0]) == 4


def _terms(logp, adv, mask=None, **kw):
    logp = torch.tensor(logp, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    return PolicyTerms(logp, torch.zeros_like(logp), torch.tensor(adv), mask, **kw)


def test_gspo_sequence_ratio_hand_computed():
    # seq 0: log ratios ln 1.2, ln 0.8 -> s = sqrt(0.96) = 0.97980, A = 1: inside the clip, loss -0.97980
    # seq 1: one token, ratio 1.5, A = 1: clipped at 1.2 -> -1.2 (no gradient); the padded token is ignored
    x = _terms(
        [[math.log(1.2), math.log(0.8)], [math.log(1.5), 0.0]],
        [1.0, 1.0],
        [[1.0, 1.0], [1.0, 0.0]],
        clip_low=0.2,
        clip_high=0.2,
    )
    loss, stats = gspo_surrogate(x)
    s0 = math.sqrt(0.96)
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3)  # seq 1's one token of three
    assert stats["ratio_mean"] == pytest.approx((2 * s0 + 1.5) / 3, abs=1e-6)
    loss.backward()
    # d/d logp_t of -s / 2 sequences = -s * (1 / n_tokens) / 2 = -s / 4 for each token of seq 0
    np.testing.assert_allclose(x.logp.grad, [[-s0 / 4, -s0 / 4], [0.0, 0.0]], atol=1e-6)


def test_gspo_split_over_ranks_equals_one_process():
    """ppo_update's rank split: rank k takes rows mb[k::world] with the global sequence count as ``total``;
    the ranks' losses and gradients add up to the single-process ones."""
    gen = torch.Generator().manual_seed(0)
    logp0 = (torch.rand(6, 5, generator=gen) - 0.5) * 0.4
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    mask[5] = 0.0  # a sequence without loss tokens counts in neither
    adv = torch.randn(6, generator=gen)
    kw = {"clip_low": 0.05, "clip_high": 0.08}

    def loss_of(rows, total):
        logp = logp0[rows].clone().requires_grad_(True)
        x = PolicyTerms(logp, torch.zeros_like(logp), adv[rows], mask[rows], total=total, **kw)
        loss, _ = gspo_surrogate(x)
        loss.backward()
        full = torch.zeros_like(logp0)
        full[rows] = logp.grad
        return loss.item(), full

    whole, grad = loss_of(torch.arange(6), None)
    total = float((mask.sum(1) > 0).sum())
    parts = [loss_of(torch.arange(6)[rank::2], total) for rank in range(2)]
    assert sum(p[0] for p in parts) == pytest.approx(whole, abs=1e-6)
    torch.testing.assert_close(parts[0][1] + parts[1][1], grad)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # ratios 1.5 and 0.5 (old logp 0), A = 1, clip (1.0, 0.28): weights 1.28 (clipped), 0.5 (no lower bound)
    # loss = mean(-1.28 ln 1.5, -0.5 ln 0.5) = (-0.518987 + 0.346574) / 2
    x = _terms([[math.log(1.5), math.log(0.5)]], [1.0], clip_low=1.0, clip_high=0.28)
    loss, stats = cispo_surrogate(x)
    assert loss.item() == pytest.approx((-1.28 * math.log(1.5) + 0.5 * math.log(2)) / 2, abs=1e-6)
    assert stats["clip_frac"] == 0.5
    loss.backward()
    # gradient -w A / 2 per token: the clipped token still learns (PPO-clip would give it 0)
    np.testing.assert_allclose(x.logp.grad, [[-0.64, -0.25]], atol=1e-6)
    y = _terms([[math.log(1.5), math.log(0.5)]], [1.0], clip_low=0.2, clip_high=0.28)
    clipped_surrogate(y)[0].backward()
    np.testing.assert_allclose(y.logp.grad, [[0.0, -0.25]], atol=1e-6)  # PPO: ratio 1.5 > 1.28 clipped


def test_per_token_advantages_and_kl_estimators_in_the_loss():
    # PPO's GAE advantages are per token: A = [1, -2] with ratio 1 -> loss mean(-1, 2) = 0.5
    x = _terms([[0.0, 0.0]], [[1.0, -2.0]])
    assert clipped_surrogate(x)[0].item() == pytest.approx(0.5)
    # log pi = ln 0.5, log ref = ln 0.25: k1 = ln 2, k2 = (ln 2)^2 / 2, k3 = 0.5 - 1 + ln 2
    ln2 = math.log(2)
    for kind, kl in (("k1", ln2), ("k2", ln2**2 / 2), ("k3", ln2 - 0.5)):
        y = _terms([[math.log(0.5)]], [0.0])
        loss, stats = policy_loss(clipped_surrogate, y, torch.tensor([[math.log(0.25)]]), 0.1, kind)
        assert stats["kl"] == pytest.approx(kl, abs=1e-6) and loss.item() == pytest.approx(0.1 * kl, abs=1e-6)


def test_kl_in_the_reward_hand_computed():
    # rloo, kl_coef 0.5: rewards [1, 0, 1] less 0.5 x summed KL [1 + 1, 0, 0] -> [0, 0, 1]
    # leave-one-out over 3: 3/2 (r - 1/3) -> [-0.5, -0.5, 1]
    cfg = _cfg("train.algorithm=rloo", "train.kl_coef=0.5", "train.kl_in=reward")
    df = pd.DataFrame({"seq_reward": [1.0, 0.0, 1.0], "prompt_index": [0, 0, 0]})
    kl = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(kl_in_reward(cfg, df, kl), [-0.5, -0.5, 1.0])


def test_gae_skips_observation_tokens_hand_computed():
    # tokens 0 and 2 are the model's, token 1 an observation; reward 1 on the last, gamma 0.9, lambda 0.8
    # t=2: delta = 1 - 0.4 = 0.6, A = 0.6; t=0: delta = 0.9 * 0.4 - 0.2 = 0.16, A = 0.16 + 0.72 * 0.6 = 0.592
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    rewards = terminal_rewards(np.array([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 1.0]]
    adv, ret = gae(rewards, torch.tensor([[0.2, 9.0, 0.4]]), mask, 0.9, 0.8)
    np.testing.assert_allclose(adv, [[0.592, 0.0, 0.6]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.792, 0.0, 1.0]], atol=1e-6)


def test_value_loss_clip_hand_computed():
    # V 2, old 0, return 3: unclipped 0.5; clipped V = 0.5 -> 0.5 x 2.5^2 = 3.125 (the larger is taken)
    v, old, ret = torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[3.0, 1.0]])
    assert value_loss(v, old, ret, torch.tensor([[1.0, 0.0]]), 0.5).item() == pytest.approx(3.125)
    assert value_loss(v, old, ret, torch.tensor([[1.0, 1.0]]), 0.0).item() == pytest.approx(0.25)


def reinforce_surrogate(x: PolicyTerms):
    """-A log pi, token mean: the whole new algorithm's loss."""
    return -(x.token_advantages() * x.logp * x.mask).sum() / (x.total or x.mask.sum()), {}


def test_a_new_algorithm_is_one_registered_function(monkeypatch):
    """Registering an estimator and a loss is all it takes: the config accepts the name and the unchanged
    PPO loop trains with it."""
    monkeypatch.setattr("rl_core.training.algorithms.ALGORITHMS", dict(ALGORITHMS))
    traits = dict(ALGORITHM_TRAITS)  # register declares the new algorithm's traits in the schema's table
    monkeypatch.setattr("rl_core.schema.config_pg.ALGORITHM_TRAITS", traits)
    monkeypatch.setattr("rl_core.training.algorithms.ALGORITHM_TRAITS", traits)

    @register("reinforce", loss=reinforce_surrogate)
    def mean_baseline(rewards, group_ids):
        return rewards - rewards.mean()

    cfg = _cfg("train.algorithm=reinforce", "train.micro_batch_size=4").train
    df = pd.DataFrame(
        {
            "prompt_ids": PROMPTS,
            "completion_ids": COMPLETIONS,
            "logprobs": [[0.0] * len(c) for c in COMPLETIONS],
            "loss_mask": [[1] * len(c) for c in COMPLETIONS],
            "advantage": mean_baseline(np.array([1.0, 0.0, 0.0, 1.0]), None),
        }
    )
    eng = Engine()
    before = eng.module.emb.weight.detach().clone()
    out = ppo_update(eng, make_batch(df, pad_id=0, seed=1), cfg)
    assert out["optimizer_steps"] == 1 and out["clip_frac"] == 0.0
    # SGD lr 0.1 on -A log pi: the first completion's first token (A = +0.5) gained probability
    after = torch.log_softmax(eng.module.emb.weight, -1)[2, 3]
    assert after > torch.log_softmax(before, -1)[2, 3]


def test_every_declared_algorithm_is_registered_and_no_other():
    """The schema's table of traits and the registry of functions name the same algorithms."""
    assert set(ALGORITHMS) == set(ALGORITHM_TRAITS)
    assert ALGORITHMS["gspo"].traits.clip == (3e-4, 4e-4) and ALGORITHMS["ppo"].critic
