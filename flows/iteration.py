"""One RL iteration: the iteration stages of the stage table, in its order (generate -> execute_envs ->
score_rewards -> train -> evaluate, the last one when it is due), as tasks of the calling flow run.

The iteration is not a Prefect subflow: every flow run keeps a heartbeat thread that sleeps in one-second
steps and is joined when the run ends, so a subflow per iteration cost up to a second of waiting on top of
~0.4 s of API calls (measured with Prefect 3.7: 1.2 s per empty subflow, 25 ms per task). Each task run is
named ``<stage>-iter-<K>`` instead, so the UI still groups them by iteration, and MLflow keeps one child run
per iteration.

Nothing passes between the tasks but the committed manifests in the store: each task resolves its inputs
from them (rl_core.stages); the rollout and train engines are held by the run's context across iterations.
"""

from __future__ import annotations

from rl_core.config import Config
from rl_core.manifest import Manifest
from rl_core.stages import ITERATION
from tasks.common import lineage, task_for


def run_iteration(
    cfg: Config, run_id: str, iteration: int, parent_mlflow_run: str | None = None, flow_run_id: str = ""
) -> dict[str, Manifest | None]:
    """Run every due stage of iteration ``iteration``; returns their manifests by stage (None: not due)."""
    lin = lineage(cfg)
    run = (
        lin.iteration_run(parent_mlflow_run, run_id, iteration, flow_run_id)
        if lin and parent_mlflow_run
        else None
    )
    manifests: dict[str, Manifest | None] = {}
    for spec in ITERATION:
        due = spec.due(cfg, iteration)
        manifests[spec.name] = task_for(spec.name)(cfg, run_id, iteration, run) if due else None
    if lin and run:
        lin.finish(run)
    return manifests
