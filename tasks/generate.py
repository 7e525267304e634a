"""Prefect task: generate rollouts from the policy with the held rollout engine."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.episodes import generate_body
from tasks.common import stage


@task(name="generate")
def generate(
    cfg: Config, run_id: str, iteration: int, policy: dict[str, Any], mlflow_run: str | None = None
) -> dict[str, Any]:
    body = lambda ctx, uri: generate_body(ctx, iteration, policy, uri)  # noqa: E731
    return stage(cfg, run_id, iteration, "generate", {"policy": policy}, body, mlflow_run)
