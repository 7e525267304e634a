"""The RL iterations: the iteration stages of the stage table, in its order (generate -> execute_envs ->
audit -> score_rewards -> curriculum -> train -> evaluate, each when it is due), as tasks of the calling flow
run.

An iteration is not a Prefect subflow: every flow run keeps a heartbeat thread that sleeps in one-second
steps and is joined when the run ends, so a subflow per iteration cost up to a second of waiting on top of its
API calls (the project's measured facts: ~1.2 s per flow or subflow run, 20-25 ms per task). Each task run is
named ``<stage>-iter-<K>`` instead, so the UI still groups them by iteration, and MLflow keeps one child run
per iteration.

Asynchronous RL (``rollout.max_staleness`` K > 0): iteration k+1 samples from the policy of iteration k-K,
which is committed before iteration k trains, so its rollout stages (generate, execute_envs, audit,
score_rewards) are submitted to run beside train k (and evaluate k) on Prefect's thread pool. The schedule is
fixed by the stage table, not by whichever finishes first: a stage's inputs are always the same committed
outputs, so a resumed or replayed asynchronous run reproduces an uninterrupted one bit for bit.

Nothing passes between the tasks but the committed manifests in the store: each task resolves its inputs from
them (rl_core.pipeline.stages); the rollout and train engines are held by the run's context across iterations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from prefect.utilities.annotations import quote

from rl_core.artifacts.manifest import Manifest
from rl_core.pipeline.stages import ITERATION, STAGES
from rl_core.run.lineage_jobs import create_iteration_run, lineage
from rl_core.schema.config import Config
from tasks.common import close_run, context, lineage_writer, task_for

ROLLOUT_STAGES = ("generate", "execute_envs", "audit", "score_rewards")


def _submit_rollouts(cfg: Config, run_id: str, iteration: int, mlflow_run: str | None) -> dict[str, Any]:
    """The rollout stages of ``iteration`` that are due, on the flow's task runner, each waiting for the one
    before; a stage not due (the audit, when off) maps to None."""
    futures: dict[str, Any] = {}
    last: list[Any] = []
    for name in ROLLOUT_STAGES:
        if not STAGES[name].due(cfg, iteration):
            futures[name] = None
            continue
        futures[name] = task_for(name).submit(quote(cfg), run_id, iteration, mlflow_run, wait_for=last)
        last = [futures[name]]
    return futures


def run_iterations(
    cfg: Config, run_id: str, parent_mlflow_run: str | None = None, flow_run_id: str = ""
) -> Iterator[tuple[int, dict[str, Manifest | None], str | None]]:
    """Run iterations 1..N; yields each one's manifests by stage (None: not due), in order, with its MLflow
    run (None without lineage)."""
    lin = lineage(cfg)
    upcoming: dict[int, Any] = {}  # iteration -> future of its MLflow run, created by the lineage thread

    def open_run(k: int, ahead: bool = False) -> str | None:
        """Iteration k's MLflow child run; ``ahead``: have the lineage thread create it meanwhile (it is
        ready, off the critical path, when iteration k starts)."""
        if lin is None or parent_mlflow_run is None:
            return None
        create = functools.partial(create_iteration_run, cfg, parent_mlflow_run, run_id, k, flow_run_id)
        if ahead:
            upcoming[k] = lineage_writer(cfg).submit(k, create)
            return None
        fut = upcoming.pop(k, None)
        return fut.result() if fut is not None else create()

    try:
        yield from _iterations(cfg, run_id, lin, open_run)
    finally:  # the last train stage's commit, when it is written behind (store.write_behind)
        context(cfg, run_id).store.behind.settle()


def _iterations(
    cfg: Config, run_id: str, lin: Any, open_run: Callable[..., str | None]
) -> Iterator[tuple[int, dict[str, Manifest | None], str | None]]:
    last = cfg.experiment.iterations
    ahead: dict[int, tuple[str | None, dict[str, Any]]] = {}
    for k in range(1, last + 1):
        if lin:
            lineage_writer(cfg).flush(upto=k - 2)  # the last iteration's records may still be in flight
        run, futures = ahead.pop(k) if k in ahead else (open_run(k), None)
        if k < last:
            open_run(k + 1, ahead=True)
        manifests: dict[str, Manifest | None] = {}
        for spec in ITERATION:
            if spec.name in ROLLOUT_STAGES and futures is not None:
                fut = futures[spec.name]
                manifests[spec.name] = fut.result() if fut is not None else None
                continue
            if spec.name == "train" and cfg.rollout.max_staleness and k < last:
                nxt = open_run(k + 1)
                ahead[k + 1] = (nxt, _submit_rollouts(cfg, run_id, k + 1, nxt))
            due = spec.due(cfg, k)
            manifests[spec.name] = task_for(spec.name)(quote(cfg), run_id, k, run) if due else None
        # the iteration's records, summary and vital signs (the caller's, before it resumes this loop) go to
        # the lineage writer as one job
        with lineage_writer(cfg).batch():
            if lin and run:
                close_run(cfg, run_id, k, run)
            yield k, manifests, run
