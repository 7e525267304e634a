"""Prefect task of the vitals stage: the iteration's vital signs and the alarms they raise.

The stage is declared in rl_core.pipeline.stages."""

from __future__ import annotations

from prefect import task as prefect_task

from rl_core.artifacts.manifest import Manifest
from rl_core.schema.config import Config
from tasks.common import run_table_stage


@prefect_task(name="vitals", task_run_name="vitals-iter-{iteration}")
def task(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None = None) -> Manifest:
    return run_table_stage(cfg, run_id, "vitals", iteration, mlflow_run)
