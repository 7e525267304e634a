"""Prefect task: rewards and group advantages."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.episodes import score_rewards_body
from tasks.common import stage


@task(name="score_rewards")
def score_rewards(
    cfg: Config,
    run_id: str,
    iteration: int,
    gen: dict[str, Any],
    env: dict[str, Any],
    mlflow_run: str | None = None,
) -> dict[str, Any]:
    inputs = {"rollouts": gen["outputs"]["rollouts"], "env_results": env["outputs"]["env_results"]}
    body = lambda ctx, uri: score_rewards_body(ctx, inputs["rollouts"], inputs["env_results"], uri)  # noqa: E731
    return stage(cfg, run_id, iteration, "score_rewards", inputs, body, mlflow_run)
