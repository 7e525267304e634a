"""Prefect task: held-out greedy accuracy and pass@k of a checkpoint."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.evaluate import evaluate_body
from tasks.common import stage


@task(name="evaluate")
def evaluate(
    cfg: Config, run_id: str, iteration: int, policy: dict[str, Any], mlflow_run: str | None = None
) -> dict[str, Any]:
    body = lambda ctx, uri: evaluate_body(ctx, iteration, policy, uri)  # noqa: E731
    return stage(cfg, run_id, iteration, "evaluate", {"policy": policy}, body, mlflow_run)
