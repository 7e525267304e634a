"""Prefect task: supervised warm-up of the base model (shared by runs with the same base config)."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.sft import warmup_body
from tasks.common import stage


@task(name="warmup")
def warmup(cfg: Config, run_id: str, init: dict[str, Any], mlflow_run: str | None = None) -> dict[str, Any]:
    inputs = {"checkpoint": init["outputs"]["checkpoint"]}
    return stage(
        cfg, run_id, 0, "warmup", inputs, lambda ctx, uri: warmup_body(ctx, init, uri), mlflow_run, base=True
    )
