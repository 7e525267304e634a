"""The policy-gradient family: each algorithm is its advantage estimator and its policy loss, registered by
name; ``train.algorithm`` picks one.

An advantage estimator is a plain function ``(rewards, group_ids) -> advantages`` (numpy, one value per
completion, over the completions that have a reward); it runs in the score_rewards stage. A policy loss is a
``rl_core.training.losses.LossFn`` (``PolicyTerms -> (loss, stats)``); it runs on every mini-batch of the
train stage. Adding an algorithm is writing the function(s) and registering them; the PPO loop never changes:

    @register("reinforce", loss=reinforce_surrogate)
    def mean_baseline(rewards, group_ids):
        return rewards - rewards.mean()

The options of ``register`` are the algorithm's switches: ``drop_zero_std`` (DAPO's dynamic sampling: groups
whose rewards are all equal carry no signal and leave the batch), ``overlong`` (DAPO's soft overlong
penalty), and its traits (``rl_core.schema.config_pg.AlgorithmTraits``, what a config is checked and completed
with; declared there for the built-in algorithms): ``aggregation``, ``fixed_aggregation``, ``clip``,
``critic`` (PPO: a value model trained beside the policy, per-token GAE advantages computed in the train
stage; ``rl_core.training.critic``).

>>> grpo(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1])).round(4).tolist()
[1.0, -1.0, 0.0, 0.0]
>>> sorted(ALGORITHMS)
['cispo', 'dapo', 'drgrpo', 'grpo', 'gspo', 'ppo', 'rloo']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from rl_core.schema.config_pg import ALGORITHM_TRAITS, AlgorithmTraits
from rl_core.training.losses import (
    Aggregation,
    LossFn,
    cispo_surrogate,
    clipped_surrogate,
    group_advantages,
    gspo_surrogate,
    kl_estimate,
)

AdvantageFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Algorithm:
    name: str
    advantage: AdvantageFn
    loss: LossFn = clipped_surrogate
    traits: AlgorithmTraits = AlgorithmTraits()
    drop_zero_std: bool = False
    overlong: bool = False

    @property
    def aggregation(self) -> Aggregation:
        return self.traits.aggregation

    @property
    def critic(self) -> bool:
        return self.traits.critic


ALGORITHMS: dict[str, Algorithm] = {}


def register(
    name: str,
    *,
    loss: LossFn = clipped_surrogate,
    drop_zero_std: bool = False,
    overlong: bool = False,
    **traits: Any,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register the decorated advantage estimator as ``name``, with its loss and switches; ``traits``
    (``AlgorithmTraits``' fields) declare a new algorithm's defaults in the schema (a built-in's are
    there)."""
    if traits or name not in ALGORITHM_TRAITS:
        ALGORITHM_TRAITS[name] = AlgorithmTraits(**traits)

    def deco(fn: AdvantageFn) -> AdvantageFn:
        ALGORITHMS[name] = Algorithm(name, fn, loss, ALGORITHM_TRAITS[name], drop_zero_std, overlong)
        return fn

    return deco


def algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


@register("grpo")
def grpo(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """GRPO: ``(r - group mean) / (group std + 1e-6)``, token-mean loss, clip-higher (0.2 / 0.28)."""
    return group_advantages(rewards, group_ids, scale_by_std=True)


@register("drgrpo")
def drgrpo(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """Dr.GRPO: ``r - group mean`` (no std scaling), each sequence's token sum over a constant (no length
    bias)."""
    return group_advantages(rewards, group_ids, scale_by_std=False)


@register("rloo")
def rloo(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """RLOO: ``r_i - mean_{j != i} r_j`` over the other completions of the prompt (= ``n/(n-1) (r_i -
    mean)``); a group of one gets 0.

    >>> rloo(np.array([1.0, 0.0, 0.0, 5.0]), np.array([0, 0, 0, 1])).tolist()
    [1.0, -0.5, -0.5, 0.0]
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros_like(rewards)
    for g in np.unique(group_ids):
        idx = group_ids == g
        n = int(idx.sum())
        if n > 1:
            adv[idx] = n / (n - 1) * (rewards[idx] - rewards[idx].mean())
    return adv


register("dapo", drop_zero_std=True, overlong=True)(grpo)
register("gspo", loss=gspo_surrogate)(grpo)  # traits (clip, aggregation): rl_core.schema.config_pg
register("cispo", loss=cispo_surrogate)(grpo)


@register("ppo")
def terminal_return(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """PPO: the score stage's column is the sequence's return (its reward, at the last completion token);
    the per-token advantages are GAE over the critic's values, in the train stage
    (``rl_core.training.critic``)."""
    return np.asarray(rewards, dtype=np.float64).copy()


def given_advantages(fn: AdvantageFn, reward: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``fn`` over the rewards that were given; 0 for a completion without one (NaN: every reward function
    abstained)."""
    ok = ~np.isnan(reward)
    adv = np.zeros(len(reward))
    if ok.any():
        adv[ok] = fn(reward[ok], groups[ok])
    return adv


def zero_std_groups(reward: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per completion: whether its group's given rewards are all equal (or none was given) — the groups
    whose advantages are all zero whatever the estimator.

    >>> zero_std_groups(np.array([1.0, 1.0, 0.0, 1.0, np.nan]), np.array([0, 0, 1, 1, 2])).tolist()
    [True, True, False, False, True]
    """
    flat = np.zeros(len(reward), dtype=bool)
    for g in np.unique(groups):
        idx = groups == g
        r = reward[idx][~np.isnan(reward[idx])]
        flat[idx] = len(r) == 0 or bool(np.all(r == r[0]))
    return flat


def longest_turn(loss_mask: Any) -> int:
    """The longest run of the model's own tokens in a completion (``loss_mask`` 1; observations 0): its
    length single-turn, its longest turn multi-turn, the length ``rollout.max_tokens`` caps (per turn).

    >>> longest_turn([1, 1, 1]), longest_turn([1, 1, 0, 0, 1, 1, 1, 0, 1]), longest_turn([])
    (3, 3, 0)
    """
    best = run = 0
    for m in loss_mask:
        run = run + 1 if m else 0
        best = max(best, run)
    return best


def overlong_penalty(lengths: np.ndarray, max_tokens: int, cache: int, penalty: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment: 0 up to ``max_tokens - cache`` tokens, then falling linearly to
    ``-penalty`` at ``max_tokens`` (a turn cannot be longer here: the engine stops it there). ``lengths``:
    each completion's ``longest_turn`` (an episode's whole length would punish one that took more turns, each
    far from the cap: three correct tool-use episodes got opposite-sign advantages by their number of turns).

    >>> overlong_penalty(np.array([4, 5, 6, 7, 8]), max_tokens=8, cache=4).tolist()
    [0.0, -0.25, -0.5, -0.75, -1.0]
    """
    expected = max_tokens - cache
    over = np.clip(np.asarray(lengths, dtype=np.float64) - expected, 0.0, None)
    return 0.0 - penalty * np.minimum(over / cache, 1.0)  # 0.0, not -0.0, where no penalty


def overlong_cache(cfg: Any) -> int:
    """The overlong window in tokens: ``train.overlong_cache``, or for an algorithm with overlong shaping a
    quarter of ``rollout.max_tokens`` (at least 1); 0 = off."""
    if cfg.train.overlong_cache is not None:
        return cfg.train.overlong_cache
    return max(1, cfg.rollout.max_tokens // 4) if algorithm(cfg.train.algorithm).overlong else 0


def score(
    cfg: Any, reward: np.ndarray, groups: np.ndarray, lengths: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The score stage's part: the final reward (with the overlong penalty), each completion's advantage and
    whether it stays in the batch (``keep``, with dynamic sampling); the extra columns and metrics. The
    default (GRPO) adds no column and no metric."""
    algo = algorithm(cfg.train.algorithm)
    cols: dict[str, np.ndarray] = {}
    metrics: dict[str, float] = {}
    cache = overlong_cache(cfg)
    if cache:
        cols["overlong"] = overlong_penalty(
            lengths, cfg.rollout.max_tokens, cache, cfg.train.overlong_penalty
        )
        reward = reward + cols["overlong"]
        metrics["overlong_mean"] = float(cols["overlong"].mean())
    if algo.drop_zero_std:
        flat = zero_std_groups(reward, groups)
        cols["keep"] = ~flat
        metrics["dropped_groups"] = float(len(np.unique(groups[flat])))
        metrics["dropped_rows"] = float(flat.sum())
    cols = {"reward": reward, "advantage": given_advantages(algo.advantage, reward, groups)} | cols
    return cols, metrics


def train_rows(rollouts: pd.DataFrame, rewards: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """The rollouts the train stage learns from, with their ``advantage`` and ``reward``: all of them, or
    those the score stage kept (dynamic sampling drops zero-signal groups from the loss and its
    denominator), in stored order."""
    df = rollouts.assign(
        advantage=rewards["advantage"].to_numpy(), seq_reward=rewards["reward"].to_numpy(dtype=np.float64)
    )
    if "keep" not in rewards.columns:
        return df, {}
    keep = rewards["keep"].to_numpy(dtype=bool)
    dropped = df.loc[~keep, "prompt_index"].nunique()
    return df[keep].reset_index(drop=True), {"dropped_groups": float(dropped), "kept_rows": float(keep.sum())}


def kl_in_reward(cfg: Any, df: pd.DataFrame, kl_tokens: torch.Tensor) -> np.ndarray:
    """``train.kl_in: reward`` for the sequence-level estimators: the advantages recomputed from each
    completion's reward less ``kl_coef`` x its summed per-token KL estimate to the reference (the score stage
    has no reference model; the train stage computes its logprobs)."""
    seq_kl = kl_tokens.sum(1).double().numpy()
    reward = df["seq_reward"].to_numpy(dtype=np.float64) - cfg.train.kl_coef * seq_kl
    groups = df["prompt_index"].to_numpy()
    return given_advantages(algorithm(cfg.train.algorithm).advantage, reward, groups)


def train_advantages(
    ctx: Any, job: Any, batch: Any, df: pd.DataFrame
) -> tuple[dict[str, float], dict[str, bytes]]:
    """The train stage's part of the algorithm, before the policy update: the KL penalty moved into the
    reward (``train.kl_in: reward``; the loss then has no KL term) and, for an algorithm with a critic, GAE
    and the critic's update. Returns metrics and the extra outputs' bytes (``critic``)."""
    cfg, algo = ctx.cfg, algorithm(ctx.cfg.train.algorithm)
    metrics: dict[str, float] = {}
    kl_tokens = None
    if cfg.train.kl_in == "reward" and batch.ref_logp is not None:
        # The KL of the policy that sampled the tokens (the rollout engine's logprobs) to the reference.
        kl_tokens = kl_estimate(batch.rollout_logp, batch.ref_logp, cfg.train.kl_estimator) * batch.loss_mask
        batch.ref_logp = None
        metrics["reward_kl_mean"] = float(kl_tokens.sum(1).mean()) if len(batch) else 0.0
        if not algo.critic:
            batch.advantages = torch.tensor(kl_in_reward(cfg, df, kl_tokens), dtype=torch.float32)
    if not algo.critic:
        return metrics, {}
    from rl_core.training.critic import critic_step  # a value model: only PPO pays for the import

    more, state = critic_step(ctx, job, batch, df["seq_reward"].to_numpy(dtype=np.float64), kl_tokens)
    return metrics | more, {"critic": state}
