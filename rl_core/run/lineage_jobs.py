"""What the lineage writer runs (``rl_core.run.lineage_writer``): module-level functions of picklable
arguments, in a module that imports only the config, the manifests and MLflow, so that the writer process
starts without torch or the stages: ~2.9 CPU s here for its whole start (these imports, Prefect's artifacts,
MLflow's store opened), where it took ~3.4 s of imports with the stages and ~1.6 s more in its first writes.

    write = functools.partial(write_iteration_records, cfg, 3, run, manifests, "FINISHED", True, 3, 5.0)
    lineage_writer(cfg).submit(3, write)  # (tasks.common.close_run)
"""

from __future__ import annotations

import functools
import importlib

from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.retries import with_retries
from rl_core.run.lineage import Lineage
from rl_core.schema.config import Config


@functools.cache
def _lineage(cfg_json: str) -> Lineage | None:
    return Lineage.open(Config.model_validate_json(cfg_json))


def lineage(cfg: Config) -> Lineage | None:
    """``cfg``'s MLflow lineage in this process (opened once: the client, its store, the experiment), or None
    with tracking off."""
    return _lineage(cfg.model_dump_json())


def prepare_writer(cfg: Config, modules: tuple[str, ...]) -> None:
    """In the writer process, at its start (normal priority, while the flow starts its engines): import
    ``modules`` and open ``cfg``'s lineage (MLflow's SQLAlchemy store and its schema check), so that the first
    writes do not pay for them at the writer's low priority, with the stages running (~1.6 CPU s here)."""
    for name in modules:
        importlib.import_module(name)
    lineage(cfg)


def write_iteration_records(
    cfg: Config,
    iteration: int,
    mlflow_run: str,
    records: list[Manifest],
    status: str,
    local: bool,
    attempts: int,
    max_wait_s: float,
) -> None:
    """An iteration's stage records and its MLflow run's end, where the lineage writer runs them."""
    lin = lineage(cfg)
    if records and local:
        lin.log_stages(mlflow_run, records)  # type: ignore[union-attr]
    elif records:  # MLflow artifacts live beside the store: the same retry policy, the same clear failure
        with_retries(
            lambda: lin.log_stages(mlflow_run, records),  # type: ignore[union-attr]
            what=f"MLflow artifact upload for iteration {iteration}",
            attempts=attempts,
            max_wait_s=max_wait_s,
        )
    lin.finish(mlflow_run, status)  # type: ignore[union-attr]


def create_iteration_run(cfg: Config, parent: str, run_id: str, iteration: int, flow_run_id: str) -> str:
    """Iteration ``iteration``'s MLflow child run (found when it exists), where the lineage writer runs."""
    return lineage(cfg).iteration_run(parent, run_id, iteration, flow_run_id)  # type: ignore[union-attr]


def log_summary(cfg: Config, parent: str, rows: list[tuple[int, dict[str, float]]]) -> None:
    """Iterations' summaries (iteration, row) on the experiment's MLflow run, on the lineage writer."""
    lineage(cfg).log_summary(parent, rows)  # type: ignore[union-attr]
