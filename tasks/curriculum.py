"""Prefect task of the curriculum stage: the task sampler's state after this iteration.

The stage is declared in rl_core.pipeline.stages."""

from __future__ import annotations

from rl_core.artifacts.manifest import Manifest
from rl_core.schema.config import Config
from tasks.common import run_table_stage, stage_task


@stage_task("curriculum")
def task(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None = None) -> Manifest:
    return run_table_stage(cfg, run_id, "curriculum", iteration, mlflow_run)
