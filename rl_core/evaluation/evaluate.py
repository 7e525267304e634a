"""Evaluation: greedy accuracy on the held-out set and unbiased pass@k from sampled completions.

A completion cut off by ``rollout.max_tokens`` (``finish_reason`` 'length') is never correct here, whatever
the verifier says of its text (a derivation cut mid-way can still parse as the answer): training's format
reward already treats it so; ``truncated`` / ``truncated_sampled`` are the shares of greedy / sampled
completions cut off. A completion an infrastructure failure kept from being scored (the environment's
``infra_error``: a lost sandbox) is left out, neither right nor wrong: greedy accuracy is over the problems
whose greedy completion was scored, pass@k over each problem's scored samples (a problem with fewer than k is
left out), and ``infra_failures`` counts the greedy and sampled completions not scored; a metric nothing could
be scored for is NaN, never 0.

>>> round(pass_at_k(n=8, c=2, k=1), 4)
0.25
>>> pass_at_k(n=8, c=0, k=8)
0.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rl_core.artifacts.seeding import derive_seed
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.generation.episodes import sample_table
from rl_core.generation.outcomes import env_outcomes
from rl_core.generation.rollout import SamplingSpec
from rl_core.run.context import RunContext


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al., 2021), defined for 1 <= k <= n.

    >>> pass_at_k(n=1, c=0, k=2)
    Traceback (most recent call last):
    ValueError: pass@k needs 1 <= k <= n samples: k=2, n=1
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples: k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def suite_rows(name: str, suite: Any, tasks: list[dict[str, Any]]) -> list[int]:
    """The positions of the held-out problems in suite ``name`` (``rl_core.schema.config.EvalSuite``): those
    whose every filtered field has one of its values, at most ``suite.size``. A suite no problem matches is
    an error naming it and the fields the problems have.

    >>> from rl_core.schema.config import EvalSuite
    >>> tasks = [{"op": "add"}, {"op": "sub"}, {"op": "add"}]
    >>> suite_rows("adds", EvalSuite(filter={"op": ["add"]}), tasks)
    [0, 2]
    >>> suite_rows("two", EvalSuite(size=2), tasks)
    [0, 1]
    """
    rows = [
        i
        for i, t in enumerate(tasks)
        if all(str(t.get(field)) in values for field, values in suite.filter.items())
    ][: suite.size]
    if not rows:
        fields = sorted({k for t in tasks for k in t if k not in ("prompt", "answer", "task_id")})
        raise ValueError(
            f"eval.suites.{name}: no held-out problem matches {suite.filter} (the problems' fields: {fields})"
        )
    return rows


def mean_reward(table: pd.DataFrame) -> float:
    """The mean reward of the sampled completions of the evaluation table's rows: each problem's mean
    (``samples_reward``) weighted by how many of its samples got a reward (``samples_rewarded``); NaN when
    none did.

    >>> mean_reward(pd.DataFrame({"samples_reward": [1.0, 0.0, np.nan], "samples_rewarded": [3, 1, 0]}))
    0.75
    """
    n = table["samples_rewarded"].to_numpy(dtype=np.float64)
    if n.sum() == 0:
        return float("nan")
    return float(np.nansum(table["samples_reward"].to_numpy(dtype=np.float64) * n) / n.sum())


def greedy_accuracy(table: pd.DataFrame) -> float:
    """The share of correct greedy completions among the problems whose greedy completion was scored
    (``greedy_scored``; every one in a table without it); NaN when none was.

    >>> greedy_accuracy(pd.DataFrame({"greedy_correct": [1, 0, 0], "greedy_scored": [True, True, False]}))
    0.5
    >>> greedy_accuracy(pd.DataFrame({"greedy_correct": [False], "greedy_scored": [False]}))
    nan
    """
    correct = table["greedy_correct"].to_numpy(dtype=bool)
    scored = (
        table["greedy_scored"].to_numpy(dtype=bool) if "greedy_scored" in table else np.ones_like(correct)
    )
    return float(correct[scored].mean()) if scored.any() else float("nan")


def mean_pass_at_k(table: pd.DataFrame, samples: int, k: int) -> float:
    """The mean pass@k of the problems with at least k scored samples (``samples_scored``; ``samples`` each in
    a table without it), each over its scored samples; NaN when no problem has k.

    >>> t = pd.DataFrame({"samples_correct": [2, 1, 0], "samples_scored": [4, 2, 1]})
    >>> mean_pass_at_k(t, 4, 1), mean_pass_at_k(t, 4, 4)  # (1/2 + 1/2 + 0) / 3; the first problem alone
    (0.3333333333333333, 1.0)
    >>> mean_pass_at_k(t.iloc[[2]], 4, 2)
    nan
    """
    correct = table["samples_correct"].to_numpy(dtype=np.int64)
    if "samples_scored" in table:
        scored = table["samples_scored"].to_numpy(dtype=np.int64)
    else:
        scored = np.full_like(correct, samples)
    values = [pass_at_k(int(m), int(c), k) for c, m in zip(correct, scored, strict=True) if m >= k]
    return float(np.mean(values)) if values else float("nan")


def suite_metrics(name: str, table: pd.DataFrame, samples: int, pass_k: list[int]) -> dict[str, float]:
    """``suite.NAME.accuracy`` (greedy), ``suite.NAME.pass@k``, ``suite.NAME.mean_reward`` (of the sampled
    completions) and ``suite.NAME.problems`` of the rows of the evaluation table that are the suite's
    problems (scored as the whole set is: ``greedy_accuracy``, ``mean_pass_at_k``)."""
    out = {
        f"suite.{name}.accuracy": greedy_accuracy(table),
        f"suite.{name}.problems": len(table),
    }
    if "samples_reward" in table:
        out[f"suite.{name}.mean_reward"] = mean_reward(table)
    for k in pass_k:
        out[f"suite.{name}.pass@{k}"] = mean_pass_at_k(table, samples, k)
    return out


def solved(outcomes: pd.DataFrame) -> np.ndarray:
    """Each episode's ``correct``, False for one with no outcome (a multi-turn episode cut off by its turns or
    the model's context: the environment never finished it), even when none has one.

    >>> solved(pd.DataFrame({"correct": [True, None]})).tolist(), solved(pd.DataFrame({"x": [1]})).tolist()
    ([True, False], [False])
    """
    if "correct" not in outcomes:
        return np.zeros(len(outcomes), dtype=bool)
    return outcomes["correct"].fillna(False).astype(bool).to_numpy()


def verdicts(rows: pd.DataFrame, outcomes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per completion (``rows`` the sampled table, ``outcomes`` its environment results, row for row): correct
    (``solved``, scored and not cut off by max_tokens), scored (no ``infra_error``) and cut off
    (``finish_reason`` 'length').

    >>> rows = pd.DataFrame({"finish_reason": ["stop", "length", "stop"]})
    >>> out = pd.DataFrame({"correct": [True, True, False], "infra_error": [None, None, "sandbox: lost"]})
    >>> [v.tolist() for v in verdicts(rows, out)]
    [[True, False, False], [True, True, False], [False, True, False]]
    """
    n = len(outcomes)
    cut = (
        (rows["finish_reason"] == "length").to_numpy(dtype=bool)
        if "finish_reason" in rows
        else np.zeros(n, bool)
    )
    if "infra_error" in outcomes:
        infra = np.array([isinstance(e, str) and bool(e) for e in outcomes["infra_error"]], dtype=bool)
    else:
        infra = np.zeros(n, dtype=bool)
    return solved(outcomes) & ~cut & ~infra, ~infra, cut


def sample_rewards(
    ctx: RunContext, sampled: pd.DataFrame, outcomes: pd.DataFrame, iteration: int
) -> np.ndarray:
    """Each sampled completion's reward under the run's ``reward.weights``, as score_rewards combines them
    (the batch components, a judge or a reward server, included); NaN where every component abstained or an
    infrastructure failure kept it from being scored."""
    from rl_core.scoring.rewards import combine, components, infra_failures, outcome_records

    records = outcome_records(outcomes, sampled["finish_reason"])
    weights = ctx.cfg.reward.weights
    texts = sampled["completion_text"].tolist()
    parts, extra = components(ctx, weights, sampled["prompt"].tolist(), texts, records, iteration)
    reward = combine(weights, parts)
    reward[[e is not None for e in infra_failures(records, extra.infra_errors)]] = np.nan
    return reward


def _per_problem_reward(sampled: pd.DataFrame, reward: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per held-out problem: the mean reward of its sampled completions that got one, and how many did."""
    frame = pd.DataFrame({"p": sampled["prompt_index"].to_numpy(), "r": reward}).dropna()
    grouped = frame.groupby("p")["r"]
    means = grouped.mean().reindex(range(n)).to_numpy(dtype=np.float64)
    counts = grouped.size().reindex(range(n), fill_value=0).to_numpy(dtype=np.int64)
    return means, counts


def _metrics(
    cfg: Any, table: pd.DataFrame, greedy: pd.DataFrame, tasks: list[dict[str, Any]]
) -> dict[str, Any]:
    """The evaluate stage's metrics from its table: overall, per operation and per suite."""
    scored = table["greedy_scored"].to_numpy(dtype=bool)
    well_formed = greedy["well_formed"].to_numpy(dtype=float)[scored]
    samples = cfg.eval.samples * len(table)
    metrics: dict[str, Any] = {
        "accuracy": greedy_accuracy(table),
        "well_formed": float(well_formed.mean()) if len(well_formed) else float("nan"),
        "problems": len(table),
        "infra_failures": int((~scored).sum() + samples - table["samples_scored"].sum()),
        "truncated": float(table["greedy_truncated"].mean()) if len(table) else float("nan"),
        "truncated_sampled": float(table["samples_truncated"].sum() / samples) if samples else float("nan"),
    }
    if "samples_reward" in table:
        metrics["mean_reward"] = mean_reward(table)
    for k in cfg.eval.pass_k:
        metrics[f"pass@{k}"] = mean_pass_at_k(table, cfg.eval.samples, k)
    for op, grp in table.groupby("op"):
        metrics[f"accuracy_{op}"] = greedy_accuracy(grp)
    for name, suite in cfg.eval.suites.items():
        metrics |= suite_metrics(
            name, table.iloc[suite_rows(name, suite, tasks)], cfg.eval.samples, cfg.eval.pass_k
        )
    return metrics


def evaluate_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg, policy = ctx.cfg, job.inputs["policy"]
    tasks = ctx.heldout_tasks
    seeds = [derive_seed(cfg.experiment.seed, "eval", i) for i in range(len(tasks))]
    # The same held-out seeds at every iteration: curves compare checkpoints, not sampling noise.
    greedy = sample_table(
        ctx,
        policy,
        tasks,
        SamplingSpec(n=1, temperature=0.0, max_tokens=cfg.rollout.max_tokens),
        seeds,
        job.iteration,
    )
    g_out = env_outcomes(ctx, greedy)
    sampled = sample_table(
        ctx,
        policy,
        tasks,
        SamplingSpec(n=cfg.eval.samples, temperature=cfg.eval.temperature, max_tokens=cfg.rollout.max_tokens),
        seeds,
        job.iteration,
    )
    s_out = env_outcomes(ctx, sampled)
    s_out = s_out.assign(correct=solved(s_out))
    g_correct, g_scored, g_cut = verdicts(greedy, g_out)
    per_problem = pd.DataFrame(
        dict(zip(("correct", "scored", "cut"), verdicts(sampled, s_out), strict=True)),
        index=s_out["prompt_index"].to_numpy(),
    )
    counts = per_problem.groupby(level=0).sum().reindex(range(len(tasks)), fill_value=0)
    table = pd.DataFrame(
        {
            "task_id": [t["task_id"] for t in tasks],
            "prompt": [t["prompt"] for t in tasks],
            "answer": [t["answer"] for t in tasks],
            "op": [t.get("op", "") for t in tasks],
            "greedy_completion": greedy["completion_text"].to_numpy(),
            "greedy_correct": g_correct,
            "greedy_scored": g_scored,
            "greedy_truncated": g_cut,
            "samples": cfg.eval.samples,
            "samples_correct": counts["correct"].to_numpy(dtype=np.int64),
            "samples_scored": counts["scored"].to_numpy(dtype=np.int64),
            "samples_truncated": counts["cut"].to_numpy(dtype=np.int64),
        }
    )
    if cfg.eval.mean_reward:
        table["samples_reward"], table["samples_rewarded"] = _per_problem_reward(
            sampled, sample_rewards(ctx, sampled, s_out, job.iteration), len(tasks)
        )
    ref = ctx.store.write_table(f"{job.out_uri}/eval.parquet", table)
    metrics = _metrics(cfg, table, g_out, tasks)
    return StageResult(
        outputs={"eval": ref},
        metrics=metrics,
        seeds={"eval": "derive_seed(run_seed, 'eval', i)"},
    )
