"""Prefect task of the evaluate stage: held-out greedy accuracy and pass@k of the policy.

The stage is declared in rl_core.pipeline.stages."""

from __future__ import annotations

from rl_core.artifacts.manifest import Manifest
from rl_core.schema.config import Config
from tasks.common import run_table_stage, stage_task


@stage_task("evaluate")
def task(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None = None) -> Manifest:
    return run_table_stage(cfg, run_id, "evaluate", iteration, mlflow_run)
