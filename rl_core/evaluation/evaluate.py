"""Evaluation: greedy accuracy on the held-out set and unbiased pass@k from sampled completions.

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
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
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


def suite_metrics(name: str, table: pd.DataFrame, samples: int, pass_k: list[int]) -> dict[str, float]:
    """``suite.NAME.accuracy`` (greedy), ``suite.NAME.pass@k``, ``suite.NAME.mean_reward`` (of the sampled
    completions) and ``suite.NAME.problems`` of the rows of the evaluation table that are the suite's
    problems."""
    out = {
        f"suite.{name}.accuracy": float(table["greedy_correct"].mean()),
        f"suite.{name}.problems": len(table),
    }
    if "samples_reward" in table:
        out[f"suite.{name}.mean_reward"] = mean_reward(table)
    for k in pass_k:
        out[f"suite.{name}.pass@{k}"] = float(
            np.mean([pass_at_k(samples, int(c), k) for c in table["samples_correct"]])
        )
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
    metrics: dict[str, Any] = {
        "accuracy": float(table["greedy_correct"].mean()),
        "well_formed": float(greedy["well_formed"].mean()),
        "problems": len(table),
    }
    if "samples_reward" in table:
        metrics["mean_reward"] = mean_reward(table)
    for k in cfg.eval.pass_k:
        metrics[f"pass@{k}"] = float(
            np.mean([pass_at_k(cfg.eval.samples, int(c), k) for c in table["samples_correct"]])
        )
    for op, grp in table.groupby("op"):
        metrics[f"accuracy_{op}"] = float(grp["greedy_correct"].mean())
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
    n_correct = s_out.groupby("prompt_index")["correct"].sum().reindex(range(len(tasks)), fill_value=0)
    table = pd.DataFrame(
        {
            "task_id": [t["task_id"] for t in tasks],
            "prompt": [t["prompt"] for t in tasks],
            "answer": [t["answer"] for t in tasks],
            "op": [t.get("op", "") for t in tasks],
            "greedy_completion": greedy["completion_text"].to_numpy(),
            "greedy_correct": solved(g_out),
            "samples": cfg.eval.samples,
            "samples_correct": n_correct.to_numpy(),
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
