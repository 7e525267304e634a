"""Run records: ``<store>/<run id>/run.json`` holds the config a run was started with.

A second run with an existing id is refused; resuming with a different config is refused (with the
difference) unless forced.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from rl_core.config import Config, config_from_dict
from rl_core.context import RunContext
from rl_core.store import Store

RUN_RECORD = "run.json"


class RunError(RuntimeError):
    """A run id is taken, unknown, or its config does not match."""


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def create_run(ctx: RunContext) -> None:
    uri = f"{ctx.store.run_uri(ctx.run_id)}/{RUN_RECORD}"
    if ctx.store.exists(uri):
        raise RunError(
            f"run id {ctx.run_id!r} already exists in {ctx.store.root}; use `rlfoundry resume {ctx.run_id}`"
        )
    ctx.store.write_json(
        uri,
        {
            "run_id": ctx.run_id,
            "config": ctx.cfg.model_dump(mode="json"),
            "config_hash": ctx.config_hash,
            "base_id": ctx.base_id,
        },
    )


def load_run(store: Store, run_id: str) -> dict[str, Any]:
    uri = f"{store.run_uri(run_id)}/{RUN_RECORD}"
    if not store.exists(uri):
        raise RunError(f"no run {run_id!r} in {store.root}")
    return store.read_json(uri)


def run_config(store: Store, run_id: str) -> Config:
    return config_from_dict(load_run(store, run_id)["config"], f"{run_id}/{RUN_RECORD}")
