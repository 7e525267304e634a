"""Prefect task of the curriculum stage: the task sampler's state after this iteration (rl_core.stages)."""

from __future__ import annotations

from prefect import task as prefect_task

from rl_core.config import Config
from rl_core.manifest import Manifest
from tasks.common import run_table_stage


@prefect_task(name="curriculum", task_run_name="curriculum-iter-{iteration}")
def task(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None = None) -> Manifest:
    return run_table_stage(cfg, run_id, "curriculum", iteration, mlflow_run)
