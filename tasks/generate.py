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


@task(name="start_rollout_engine")
def start_rollout_engine(cfg: Config, run_id: str, policy: dict[str, Any]) -> None:
    """Start (or reuse) the process-wide rollout engine on ``policy`` before any stage runs, so a resumed
    process sets up its threads and memory exactly as an uninterrupted one did."""
    from rl_core.context import get_context
    from rl_core.episodes import policy_engine

    policy_engine(get_context(cfg, run_id), policy)
