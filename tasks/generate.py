"""Prefect task of the generate stage: sample policy completions with the rollout engine.

The stage is declared in rl_core.pipeline.stages."""

from __future__ import annotations

from prefect import task as prefect_task

from rl_core.artifacts.manifest import Manifest
from rl_core.schema.config import Config
from tasks.common import run_table_stage, stage_task


@stage_task("generate")
def task(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None = None) -> Manifest:
    return run_table_stage(cfg, run_id, "generate", iteration, mlflow_run)


@prefect_task(name="start_rollout_engine")
def start_rollout_engine(cfg: Config, run_id: str) -> None:
    """Start the run's rollout engine on the warmed-up base model before any stage runs, so a resumed process
    sets up its threads and memory exactly as an uninterrupted one did."""
    from rl_core.artifacts.stage import committed
    from rl_core.generation.episodes import policy_engine
    from tasks.common import context

    ctx = context(cfg, run_id)
    warm = committed(ctx.store, ctx.base_id, 0, "warmup")
    if warm is None:
        raise RuntimeError(f"run {run_id}: the base model's warm-up is not committed")
    policy_engine(ctx, warm.outputs["checkpoint"], 0)
