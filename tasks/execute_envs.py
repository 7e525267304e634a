"""Prefect task: run every completion through its environment."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.episodes import execute_envs_body
from tasks.common import stage


@task(name="execute_envs")
def execute_envs(
    cfg: Config, run_id: str, iteration: int, gen: dict[str, Any], mlflow_run: str | None = None
) -> dict[str, Any]:
    rollouts = gen["outputs"]["rollouts"]
    body = lambda ctx, uri: execute_envs_body(ctx, rollouts, uri)  # noqa: E731
    return stage(cfg, run_id, iteration, "execute_envs", {"rollouts": rollouts}, body, mlflow_run)
