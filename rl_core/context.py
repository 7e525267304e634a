"""A run's context: its config, id, store and task data, shared by every stage body.

ctx = RunContext(cfg, "20261129-abc123")
ckpt = ctx.local_checkpoint(manifest["outputs"]["checkpoint"])
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from rl_core.config import Config, config_hash
from rl_core.paths import cache_dir, state_dir
from rl_core.stage import ref_of
from rl_core.store import Store


def store_root(cfg: Config) -> str:
    return cfg.store.uri or str(state_dir() / "store")


def open_store(cfg: Config, root: str | None = None) -> Store:
    """The run's store (or ``root``) with the config's S3 retry policy."""
    return Store(
        root or store_root(cfg), retries=cfg.store.retries, retry_max_wait_s=cfg.store.retry_max_wait_s
    )


def base_id(cfg: Config) -> str:
    """Runs whose model, task, warm-up and seed agree share one warmed-up base model."""
    part = {k: cfg.model_dump(mode="json")[k] for k in ("model", "task", "warmup")}
    part["seed"] = cfg.experiment.seed
    return f"_base/{config_hash(part)[:16]}"


class RunContext:
    def __init__(self, cfg: Config, run_id: str, store: Store | None = None):
        self.cfg = cfg
        self.run_id = run_id
        self.store = store or open_store(cfg)
        self.config_hash = config_hash(cfg)
        self.base_id = base_id(cfg)
        self.base_hash = self.base_id.split("/")[1]

    @functools.cached_property
    def env(self) -> Any:
        from envs.base import make_env

        return make_env(self.cfg.task.env)

    @functools.cached_property
    def train_tasks(self) -> list[dict[str, Any]]:
        return self.env.tasks("train", self.cfg.task, self.cfg.experiment.seed)

    @functools.cached_property
    def heldout_tasks(self) -> list[dict[str, Any]]:
        return self.env.tasks("heldout", self.cfg.task, self.cfg.experiment.seed)

    def local_checkpoint(self, e: dict[str, Any]) -> Path:
        """A verified local folder of a stored checkpoint entry (uri, sha256, files)."""
        return self.store.local_dir(ref_of(e), e["files"], cache_dir("checkpoints"))

    def max_model_len(self) -> int:
        return self.cfg.model.max_position


_CONTEXTS: dict[tuple[str, str], RunContext] = {}


def get_context(cfg: Config, run_id: str) -> RunContext:
    """One context per (run, config) in this process, so task data is built once."""
    key = (run_id, config_hash(cfg))
    if key not in _CONTEXTS:
        _CONTEXTS[key] = RunContext(cfg, run_id)
    return _CONTEXTS[key]
