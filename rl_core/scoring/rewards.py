"""Reward functions, and the stage body of score_rewards: each completion's reward, then its advantage
(by the estimator of ``train.algorithm``: ``rl_core.training.algorithms``).

A reward function is a plain function ``(prompt, completion, outcome) -> float | None``: the prompt text,
the completion text and the environment's ``Outcome`` record (``envs.base.Outcome``: ``correct``,
``well_formed``, ``finish_reason`` and whatever else the environment reported). ``None`` means *abstain*:
the function has nothing to say about this completion, which is not the same as a zero.

The config combines functions with weights (``reward.weights``): a built-in name below, ``module:function``
(your own code), or a name an installed package declares under the ``rlfoundry.rewards`` entry points. A
completion's reward is the weighted sum of the components that did not abstain; when every component
abstains the completion has no reward, gets advantage 0 (it does not move the policy) and is counted
(``abstained``), and its group's advantages use only the rewards that were given. Every component is stored
per rollout (a column named by its config key) and summarised per iteration (``<key>_mean``,
``<key>_abstained``), so a run's rewards can be audited row by row.

    weights: {correct: 1.0, format: 0.1, "my_rewards:brevity": 0.05}

Batch components score a whole iteration at once (``batch_builtin``): ``judge``, the LLM judge of
``rl_core.scoring.judge`` (``reward.judge``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from envs.base import Outcome
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.run.context import RunContext
from rl_core.schema.config_reward import BUILTIN_REWARDS, user_reward_function
from rl_core.training.algorithms import drgrpo, given_advantages, grpo, longest_turn, score

log = logging.getLogger("rlfoundry.rewards")

RewardFn = Callable[[str, str, Outcome], "float | None"]
_BUILTIN: dict[str, RewardFn] = {}


@dataclass
class BatchScores:
    """What a batch reward component answers for a whole iteration's completions.

    ``values``: one reward per completion (None: abstain). ``infra_errors``: per completion, None or what
    failed that is not the completion's doing (a server that timed out on its row): such a completion gets
    no reward, is left out of its group's advantage and is counted as an infrastructure failure, never
    scored 0. ``metrics``: summed into the stage's metrics (latency, tokens...). ``columns``: extra per-row
    columns stored in rewards.parquet (e.g. the judge's raw verdict)."""

    values: list[float | None]
    infra_errors: list[str | None] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    columns: dict[str, list[Any]] = field(default_factory=dict)


BatchRewardFn = Callable[[RunContext, list[str], list[str], list[Outcome], int], BatchScores]
_BATCH: dict[str, BatchRewardFn] = {}


def _declared(name: str) -> None:
    if name not in BUILTIN_REWARDS:
        raise ValueError(
            f"built-in reward {name!r}: declare it in rl_core.schema.config_reward.BUILTIN_REWARDS"
        )


def batch_builtin(name: str) -> Callable[[BatchRewardFn], BatchRewardFn]:
    """Register a reward component scored once per iteration over every completion (a served reward model,
    an LLM judge): ``fn(ctx, prompts, completions, outcomes, iteration) -> BatchScores`` (``iteration``: the
    stage's, for what a component draws: a sampling judge's seeds)."""
    _declared(name)

    def deco(fn: BatchRewardFn) -> BatchRewardFn:
        _BATCH[name] = fn
        return fn

    return deco


def builtin(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register one of the project's reward functions under ``name``."""
    _declared(name)

    def deco(fn: RewardFn) -> RewardFn:
        _BUILTIN[name] = fn
        return fn

    return deco


@builtin("correct")
def correct(prompt: str, completion: str, outcome: Outcome) -> float | None:
    """1 when the environment's verifier accepted the answer, else 0.

    >>> correct("2+3=", "5", Outcome(correct=True, well_formed=True))
    1.0
    >>> correct("2+3=", "6", Outcome(correct=False, well_formed=True))
    0.0
    """
    return float(outcome.correct)


@builtin("format")
def well_formed_and_stopped(prompt: str, completion: str, outcome: Outcome) -> float | None:
    """1 when the answer has the task's form and the model ended it itself (EOS, not cut off by max_tokens).

    >>> well_formed_and_stopped("2+3=", "6", Outcome(correct=False, well_formed=True, finish_reason="stop"))
    1.0
    >>> cut_off = Outcome(correct=False, well_formed=True, finish_reason="length")
    >>> well_formed_and_stopped("2+3=", "66666", cut_off)
    0.0
    """
    return float(outcome.well_formed and outcome.finish_reason == "stop")


@builtin("partial")
def partial_credit(prompt: str, completion: str, outcome: Outcome) -> float | None:
    """Dense partial credit: the share of the answer in the right place (``digit_match``, reported by
    arithmetic and countup); abstains where the environment reports none.

    >>> partial_credit("8..11=", "8 9 10", Outcome(correct=False, well_formed=True, digit_match=0.75))
    0.75
    >>> partial_credit("print hi", "print('hi')", Outcome(correct=True, well_formed=True)) is None
    True
    """
    value = getattr(outcome, "digit_match", None)
    return None if value is None or value != value else float(value)  # NaN: a row without it


def reward_function(name: str) -> RewardFn | BatchRewardFn:
    """The function a ``reward.weights`` key names: built-in (per row, or a batch component),
    ``module:function``, or an entry point (rl_core.schema.config_reward.user_reward_function)."""
    if name in _BATCH:
        return _BATCH[name]
    if name in _BUILTIN:
        return _BUILTIN[name]
    return user_reward_function(name)


def components(
    ctx: RunContext | None,
    weights: dict[str, float],
    prompts: list[str],
    texts: list[str],
    outcomes: list[Outcome],
    iteration: int = 0,
) -> tuple[dict[str, np.ndarray], BatchScores]:
    """Each reward function's value per completion (NaN where it abstained), and what the batch components
    reported besides (infrastructure failures per row, metrics, columns); an answer that is not a number is an
    error naming the function and the row."""
    out, extra = {}, BatchScores(values=[], infra_errors=[None] * len(texts))
    for name in weights:
        if name in _BATCH:
            got = _BATCH[name](ctx, prompts, texts, outcomes, iteration)  # type: ignore[arg-type]
            out[name] = _checked(f"reward component {name!r}", got.values, len(texts))
            for i, err in enumerate(got.infra_errors or []):
                if err is not None and extra.infra_errors[i] is None:  # type: ignore[index]
                    extra.infra_errors[i] = f"{name}: {err}"  # type: ignore[index]
            extra.metrics |= {f"{name}_{k}": v for k, v in got.metrics.items()}
            extra.columns |= {f"{name}_{k}": v for k, v in got.columns.items()}
            continue
        fn = reward_function(name)
        got = [fn(p, t, o) for p, t, o in zip(prompts, texts, outcomes, strict=True)]
        out[name] = _checked(f"reward function {name!r}", got, len(texts))
    return out, extra


def _checked(what: str, values: list[Any], n: int) -> np.ndarray:
    """``values`` as floats, None read as NaN (abstained); anything else that is not a finite number is an
    error naming ``what`` and the row (an infinite or NaN reward would reach the update as NaN advantages)."""
    if len(values) != n:
        raise ValueError(f"{what} returned {len(values)} values for {n} completions")
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"{what} returned {v!r} for row {i}: expected a float or None")
        if not math.isfinite(v):
            raise ValueError(f"{what} returned {v!r} for row {i}: a reward must be finite (None abstains)")
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def combine(weights: dict[str, float], parts: dict[str, np.ndarray]) -> np.ndarray:
    """The weighted sum of the components that did not abstain; NaN where all abstained.

    >>> parts = {"a": np.array([1.0, np.nan, np.nan]), "b": np.array([1.0, 1.0, np.nan])}
    >>> combine({"a": 1.0, "b": 0.5}, parts)
    array([1.5, 0.5, nan])
    """
    n = len(next(iter(parts.values())))
    total, given = np.zeros(n), np.zeros(n, dtype=bool)
    for name, w in weights.items():
        v = parts[name]
        ok = ~np.isnan(v)
        total = total + np.where(ok, w * np.where(ok, v, 0.0), 0.0)
        given |= ok
    return np.where(given, total, np.nan)


def floored(reward: np.ndarray, flagged: np.ndarray) -> np.ndarray:
    """``reward`` with the ``flagged`` completions (an exploit the audit zeroes, a replay that did not
    reproduce) at the floor: 0, or the batch's lowest other reward when that is lower (a reward model's raw
    score, a negative weight). A flagged completion is never paid above an honest one, so its group
    advantage is never above theirs (0 alone would beat a wrong answer the reward model scores -0.4).

    >>> floored(np.array([1.0, -0.4, 5.0, np.nan]), np.array([False, False, True, False]))
    array([ 1. , -0.4, -0.4,  nan])
    >>> floored(np.array([1.0, 2.0]), np.array([True, False]))
    array([0., 2.])
    """
    honest = reward[~flagged & ~np.isnan(reward)]
    out = reward.copy()
    out[flagged] = min(0.0, float(honest.min())) if honest.size else 0.0
    return out


def advantages(reward: np.ndarray, groups: np.ndarray, scale_by_std: bool) -> np.ndarray:
    """GRPO (or Dr.GRPO) group advantages over the rewards that were given; 0 for a completion without one."""
    return given_advantages(grpo if scale_by_std else drgrpo, reward, groups)


def outcome_records(env: pd.DataFrame, finish: pd.Series) -> list[Outcome]:
    """The stored environment results as ``Outcome`` records (``finish_reason`` from the rollouts)."""
    rows: list[dict[str, Any]] = env.drop(columns=["prompt_index", "sample_index"]).to_dict("records")
    return [Outcome(**r, finish_reason=f) for r, f in zip(rows, finish.tolist(), strict=True)]


def infra_failures(outcomes: list[Outcome], reported: list[str | None] | None) -> list[str | None]:
    """Per completion, the infrastructure failure that kept it from being scored (the environment's
    ``infra_error``: a sandbox that could not run it; or a batch component's), else None.

    >>> ok, broken = Outcome(correct=False, well_formed=True), Outcome(correct=False, well_formed=False,
    ...     infra_error="sandbox: supervisor died")
    >>> infra_failures([ok, broken, ok], [None, None, "judge: timeout"])
    [None, 'sandbox: supervisor died', 'judge: timeout']
    """
    out: list[str | None] = []
    for i, o in enumerate(outcomes):
        err = getattr(o, "infra_error", None)
        err = err if isinstance(err, str) and err else None  # NaN/None in a stored table: no failure
        out.append(err or (reported[i] if reported else None))
    return out


def audit_zeroed(ctx: RunContext, job: StageJob, df: pd.DataFrame) -> np.ndarray:
    """Which completions the audit stage zeroes (``reward.audit.zero``); none without an audit."""
    if "audit" not in job.inputs:
        return np.zeros(len(df), dtype=bool)
    audit = ctx.store.read_table(job.inputs["audit"])
    lined_up = len(audit) == len(df) and (
        (audit["prompt_index"].to_numpy() == df["prompt_index"].to_numpy()).all()
        and (audit["sample_index"].to_numpy() == df["sample_index"].to_numpy()).all()
    )
    if not lined_up:
        raise ValueError(f"audit flags {job.inputs['audit'].uri} do not line up with the rollouts")
    return audit["zeroed"].to_numpy(dtype=bool)


def replay_mismatches(env: pd.DataFrame, iteration: int = 0) -> np.ndarray:
    """Which episodes' environments gave another observation when replayed (``replay_mismatch``, set by
    ``rl_core.generation.outcomes``); none for single-turn results, which have no such column. Such an episode
    (a non-hermetic environment: time, randomness, state outside the task) earned an outcome nobody can
    reproduce: the score stage counts it, warns, and scores it 0, so that provoking one never pays.

    >>> replay_mismatches(pd.DataFrame({"replay_mismatch": [False, True, None]})).tolist()
    [False, True, False]
    >>> replay_mismatches(pd.DataFrame({"correct": [1.0]})).tolist()
    [False]
    """
    if "replay_mismatch" not in env.columns:
        return np.zeros(len(env), dtype=bool)
    found = env["replay_mismatch"].fillna(False).astype(bool).to_numpy()
    if found.any():
        log.warning(
            "iteration %d: %d of %d episodes gave another outcome when replayed (a non-hermetic "
            "environment): scored 0",
            iteration,
            int(found.sum()),
            len(env),
        )
    return found


def score_rewards_body(ctx: RunContext, job: StageJob) -> StageResult:
    rc = ctx.cfg.reward
    rollouts, env_results = job.inputs["rollouts"], job.inputs["env_results"]
    df = ctx.store.read_table(rollouts)
    env = ctx.store.read_table(env_results)
    if len(df) != len(env) or not (df["prompt_index"].to_numpy() == env["prompt_index"].to_numpy()).all():
        raise ValueError(f"env results {env_results.uri} do not line up with rollouts {rollouts.uri}")
    outcomes = outcome_records(env, df["finish_reason"])
    texts = df["completion_text"].tolist()
    parts, extra = components(ctx, rc.weights, df["prompt"].tolist(), texts, outcomes, job.iteration)
    infra = infra_failures(outcomes, extra.infra_errors)
    groups = df["prompt_index"].to_numpy()
    lengths = np.array([longest_turn(m) for m in df["loss_mask"]], dtype=np.int64)  # what max_tokens caps
    combined = combine(rc.weights, parts)
    zeroed = audit_zeroed(ctx, job, df)
    mismatched = replay_mismatches(env, job.iteration)
    combined = floored(combined, zeroed | mismatched)
    combined[[e is not None for e in infra]] = np.nan  # no reward, out of its group's advantage
    scored, algo_metrics = score(ctx.cfg, combined, groups, lengths)
    reward = scored["reward"]
    correct_ = env["correct"].to_numpy(dtype=np.float64)
    formatted = parts.get("format")
    if formatted is None:
        formatted = np.array([well_formed_and_stopped("", "", o) for o in outcomes], dtype=np.float64)
    out = pd.DataFrame(
        {"prompt_index": df["prompt_index"], "sample_index": df["sample_index"], "correct": correct_}
        | {"format": formatted}
        | {k: v for k, v in parts.items() if k not in ("correct", "format")}
        | ({"infra_error": infra} if any(e is not None for e in infra) else {})
        | extra.columns
        | scored
    )
    ref = ctx.store.write_table(f"{job.out_uri}/rewards.parquet", out)
    given = out.dropna(subset=["reward"]).groupby("prompt_index")["reward"]
    summary = {}
    for k, v in parts.items():
        summary[f"{k}_abstained"] = float(np.isnan(v).mean())
        summary[f"{k}_mean"] = float(np.nanmean(v)) if (~np.isnan(v)).any() else float("nan")
    return StageResult(
        outputs={"rewards": ref},
        metrics={
            "mean_reward": float(np.nanmean(reward)) if (~np.isnan(reward)).any() else float("nan"),
            "accuracy": float(correct_.mean()),
            "format_rate": float(formatted.mean()),
            "abstained": int(np.isnan(reward).sum() - sum(e is not None for e in infra)),
            "infra_failures": int(sum(e is not None for e in infra)),
            "zeroed": int(zeroed.sum()),
            "replay_mismatches": int(mismatched.sum()),
            "zero_std_groups": float((given.std(ddof=0) == 0).mean()) if len(given) else 1.0,
            **summary,
            **extra.metrics,
            **algo_metrics,
            **_placement(ctx),
        },
    )


def _placement(ctx: RunContext) -> dict[str, Any]:
    """Where the reward model ran, when it ran on the run's cluster (``rl_core.scoring.ray_reward``)."""
    held = ctx.held.reward
    where = held.scorer.placement if held is not None else None
    return {"placement": where} if where else {}


# The batch components register themselves on import (after everything above, which they use).
import rl_core.scoring.judge  # noqa: E402, F401
from rl_core.scoring import reward_client as _reward_client  # noqa: E402, F401
