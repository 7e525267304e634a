"""What every stage task does around its rl_core body: resolve its inputs from the committed manifests (the
stage table says which), commit-or-skip, then log lineage.

One ``RunContext`` per (run, config) lives as long as this process, so the engines and pools it holds carry
over from one iteration (and one flow run) to the next; the library itself keeps no process-wide state.
Each stage's task is ``tasks/<stage name>.py``'s ``task`` (``task_for``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from rl_core.artifacts.faults import fault
from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.stage import committed, run_stage
from rl_core.artifacts.store_lock import run_shared_stage
from rl_core.pipeline.stages import STAGES, run_body
from rl_core.run.context import RunContext
from rl_core.run.lineage import write_mode
from rl_core.run.lineage_jobs import lineage, prepare_writer, write_iteration_records
from rl_core.run.lineage_writer import LineageWriter
from rl_core.run.run_lock import run_guard
from rl_core.schema.config import Config, config_hash

_CONTEXTS: dict[tuple[str, str], RunContext] = {}


def context(cfg: Config, run_id: str) -> RunContext:
    """The context of ``run_id`` under ``cfg`` in this process (created on first use)."""
    key = (run_id, config_hash(cfg))
    if key not in _CONTEXTS:
        ctx = RunContext(cfg, run_id)
        ctx.server_launcher = _server_launcher(ctx)
        ctx.reward_launcher = _reward_launcher(ctx)
        _CONTEXTS[key] = ctx
    return _CONTEXTS[key]


def _server_launcher(ctx: RunContext) -> Any:
    """Starts the run's ``rollout.servers`` vLLM servers on a checkpoint folder (infra/rollout_servers.py)."""

    def launch(ckpt_dir: str) -> tuple[list[str], Any, Any, str]:
        from infra.rollout_servers import RolloutServers
        from rl_core.models.placement import engine_dtype

        servers = RolloutServers(
            ckpt_dir,
            ctx.cfg.rollout,
            max_model_len=ctx.max_model_len(),
            dtype=engine_dtype(ctx.cfg),
            placement=ctx.placement,
        )
        return servers.start(ctx.cfg.rollout.servers), servers.restart, servers.stop, servers.token

    return launch


def _reward_launcher(ctx: RunContext) -> Any:
    """Starts the run's reward server on a reward model folder (infra/reward_server.py), tied to this
    process."""

    def launch(path: str) -> tuple[str, Any, Any]:
        from infra.reward_server import RewardServer

        server = RewardServer(path, kv_cache_mb=ctx.cfg.reward.model.kv_cache_mb, placement=ctx.placement)
        return server.start(), server.restart, server.stop

    return launch


def replay_hooks(ctx: RunContext) -> None:
    """What a replayed stage may start: a reward server (its scores come from the served model). Rollout
    servers are not: generate replays on the in-process engine, which samples bit for bit alike. And what
    ``rlfoundry eval`` may start: the inspect-ai tasks of ``eval.inspect`` (one checkpoint server each)."""
    from infra.inspect_harness import Served

    ctx.reward_launcher = _reward_launcher(ctx)
    ctx.inspect_runner = Served


@functools.cache
def _writer(cfg_json: str) -> LineageWriter:
    cfg = Config.model_validate_json(cfg_json)
    # what its writes import and open, at its start (rl_core.run.lineage_jobs; flows.observe's vital-sign
    # tables: Prefect's artifacts)
    modules = ("mlflow.tracking", "mlflow.entities", "flows.observe", "prefect.artifacts")
    return LineageWriter(write_mode(cfg), (functools.partial(prepare_writer, cfg, modules),))


def lineage_writer(cfg: Config) -> LineageWriter:
    """The writer of ``cfg``'s lineage records in this process: in its writer process, inline or on its
    thread as ``tracking.writes`` says (rl_core.run.lineage). Its writes are picklable (module-level
    functions with their arguments), so that any mode can take them."""
    return _writer(cfg.model_dump_json())


def run_logger() -> Any:
    """The flow or task run's logger (its lines reach the Prefect UI), or a plain one outside any run (a
    replay)."""
    import logging

    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("rlfoundry")


def stage_task(name: str) -> Any:
    """The Prefect task decorator of stage ``name``: its runs named ``<stage>-iter-<K>`` (the UI groups them
    by iteration), and no Prefect cache policy: a stage's commit-or-skip is its manifest in the store, and
    Prefect's default policy hashed the whole config at every call."""
    from prefect import task
    from prefect.cache_policies import NONE

    return task(name=name, task_run_name=f"{name}-iter-{{iteration}}", cache_policy=NONE)


def task_for(stage: str) -> Any:
    """The Prefect task of a stage of the table: ``task`` in ``tasks/<stage>.py``. Call it (or ``submit``)
    with the config as ``quote(cfg)`` (``prefect.utilities.annotations``): Prefect then passes it as it is
    instead of walking the whole model for futures at every call (~2.5 ms a task run, with the cache policy
    above)."""
    return importlib.import_module(f"tasks.{stage}").task


def run_table_stage(cfg: Config, run_id: str, name: str, iteration: int, mlflow_run: str | None) -> Manifest:
    """Run stage ``name`` of ``run_id`` (of the shared base model for a base stage) at ``iteration``: its
    inputs are the outputs its table entry names, read from the committed manifests; log it to MLflow."""
    spec = STAGES[name]
    ctx = context(cfg, run_id)

    def owner(stage: str) -> str:
        return ctx.base_id if STAGES[stage].base else run_id

    from rl_core.pipeline.stages import resolve_inputs

    inputs = resolve_inputs(spec, cfg, iteration, lambda s, k: committed(ctx.store, owner(s), k, s))
    chash = ctx.base_hash if spec.base else ctx.config_hash
    log = run_logger()
    log.info("%s of iteration %d: started (%s)", name, iteration, spec.doc)

    def body(job: Any) -> Any:
        return run_body(spec, ctx, job)

    if spec.base:  # built once by the runs that share it, under its lock in the store
        sc = ctx.cfg.store
        manifest = run_shared_stage(
            ctx.store,
            ctx.base_id,
            iteration,
            name,
            chash,
            inputs,
            body,
            holder=run_id,
            stale_after_s=sc.lock_stale_after_s,
            heartbeat_s=sc.lock_heartbeat_s,
        )
    else:
        guard = run_guard(ctx)  # committed only while this process holds the run (rl_core.run.run_lock)
        accepted = ctx.accepted_hashes
        manifest = run_stage(ctx.store, run_id, iteration, name, chash, inputs, body, accepted, guard)
    how = "reused: committed earlier" if manifest.reused else f"committed in {manifest.timings.seconds:.2f} s"
    log.info("%s of iteration %d: %s", name, iteration, how)
    if lineage(cfg) is not None and mlflow_run is not None:
        lineage_writer(cfg).defer(mlflow_run, manifest)  # written when the MLflow run closes (close_run)
    return manifest


def close_run(cfg: Config, run_id: str, iteration: int, mlflow_run: str, status: str = "FINISHED") -> Any:
    """On the lineage writer: the stage records held for ``mlflow_run`` in one batch, then the run's end
    (its future). Stage records go one batch per MLflow run: one ``log_batch`` per stage cost ~15 ms of
    CPU each."""
    fault("lineage:close", iteration)  # (a kill after the iteration's commit, before its lineage is written)
    ctx = context(cfg, run_id)
    records = lineage_writer(cfg).take(mlflow_run)
    sc = ctx.store
    write = functools.partial(
        write_iteration_records, cfg, iteration, mlflow_run, records, status, sc.is_local, sc.retries,
        sc.retry_max_wait_s,
    )  # fmt: skip
    writer = lineage_writer(cfg)
    # A stage's records follow its commit (a train stage's may still be writing behind: store.write_behind):
    # where the writer is a thread of this process (or the flow's own), it waits for it; a writer process
    # cannot, so the flow does before handing the records over.
    if writer.mode == "process":
        sc.behind.settle()
    else:
        write = functools.partial(_after_commits, sc, write)
    return writer.submit(iteration, write)


def _after_commits(store: Any, write: Callable[[], None]) -> None:
    store.behind.settle()
    write()
