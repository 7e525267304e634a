"""Prefect task: one policy update on the train engine; writes the next checkpoint and optimizer state."""

from __future__ import annotations

from typing import Any

from prefect import task

from rl_core.config import Config
from rl_core.train import train_body
from tasks.common import stage


@task(name="train")
def train(
    cfg: Config,
    run_id: str,
    iteration: int,
    policy: dict[str, Any],
    optimizer: dict[str, Any] | None,
    reference: dict[str, Any],
    gen: dict[str, Any],
    rewards: dict[str, Any],
    mlflow_run: str | None = None,
) -> dict[str, Any]:
    inputs = {
        "policy": policy,
        "rollouts": gen["outputs"]["rollouts"],
        "rewards": rewards["outputs"]["rewards"],
    }
    if optimizer is not None:
        inputs["optimizer"] = optimizer
    if cfg.train.kl_coef > 0:
        inputs["reference"] = reference
    body = lambda ctx, uri: train_body(ctx, iteration, inputs, uri)  # noqa: E731
    return stage(cfg, run_id, iteration, "train", inputs, body, mlflow_run)
