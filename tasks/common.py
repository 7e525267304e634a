"""What every stage task does around its rl_core body: commit-or-skip, then log lineage."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rl_core.config import Config
from rl_core.context import RunContext, get_context
from rl_core.lineage import Lineage
from rl_core.stage import StageResult, run_stage
from rl_core.store import with_retries


@functools.cache
def _lineage(cfg_json: str) -> Lineage | None:
    return Lineage.open(Config.model_validate_json(cfg_json))


def lineage(cfg: Config) -> Lineage | None:
    return _lineage(cfg.model_dump_json())


def stage(
    cfg: Config,
    run_id: str,
    iteration: int,
    name: str,
    inputs: dict[str, dict[str, Any]],
    body: Callable[[RunContext, str], StageResult],
    mlflow_run: str | None,
    *,
    base: bool = False,
) -> dict[str, Any]:
    """Run one stage of ``run_id`` (or of the shared base model when ``base``) and log it to MLflow."""
    ctx = get_context(cfg, run_id)
    owner, chash = (ctx.base_id, ctx.base_hash) if base else (run_id, ctx.config_hash)
    manifest = run_stage(ctx.store, owner, iteration, name, chash, inputs, lambda uri: body(ctx, uri))
    lin = lineage(cfg)
    if lin is not None and mlflow_run is not None:
        if ctx.store.is_local:
            lin.log_stage(mlflow_run, manifest)
        else:  # MLflow artifacts live beside the store: the same retry policy, the same clear failure
            with_retries(
                lambda: lin.log_stage(mlflow_run, manifest),
                what=f"MLflow artifact upload for {name}",
                attempts=ctx.store.retries,
                max_wait_s=ctx.store.retry_max_wait_s,
            )
    return manifest
