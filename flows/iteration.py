"""The RL iteration flow: the iteration stages of the stage table, in its order (generate -> execute_envs ->
score_rewards -> train -> evaluate, the last one when it is due).

Nothing passes between the tasks but the committed manifests in the store: each task resolves its inputs
from them (rl_core.stages); the rollout and train engines are held by the run's context across iterations.
"""

from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run

from rl_core.config import Config
from rl_core.manifest import Manifest
from rl_core.stages import ITERATION
from tasks.common import lineage, task_for


@flow(name="rl-iteration", flow_run_name="{run_id}-iter-{iteration}", validate_parameters=False)
def iteration_flow(
    cfg: Config, run_id: str, iteration: int, parent_mlflow_run: str | None = None
) -> dict[str, Manifest | None]:
    """Run every due stage of iteration ``iteration``; returns their manifests by stage (None: not due)."""
    lin = lineage(cfg)
    run = (
        lin.iteration_run(parent_mlflow_run, run_id, iteration, flow_run.get_id())
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
