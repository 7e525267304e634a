"""Prefect task: build the tiny model and tokenizer (shared by every run with the same base config)."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.sft import init_body
from tasks.common import stage


@task(name="init_model")
def init_model(cfg: Config, run_id: str, mlflow_run: str | None = None) -> dict[str, Any]:
    return stage(cfg, run_id, 0, "init", {}, init_body, mlflow_run, base=True)
