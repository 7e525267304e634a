"""The RL iteration flow: generate -> execute_envs -> score_rewards -> train -> evaluate.

Only artifact references (manifest entries) pass between tasks; the rollout and train engines are process-wide
handles held across iterations.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from rl_core.config import Config
from tasks.common import lineage
from tasks.evaluate import evaluate
from tasks.execute_envs import execute_envs
from tasks.generate import generate
from tasks.score_rewards import score_rewards
from tasks.train import train


@flow(name="rl-iteration", flow_run_name="{run_id}-iter-{iteration}", validate_parameters=False)
def iteration_flow(
    cfg: Config,
    run_id: str,
    iteration: int,
    policy: dict[str, Any],
    optimizer: dict[str, Any] | None,
    reference: dict[str, Any],
    parent_mlflow_run: str | None = None,
) -> dict[str, Any]:
    lin = lineage(cfg)
    run = (
        lin.iteration_run(parent_mlflow_run, run_id, iteration, flow_run.get_id())
        if lin and parent_mlflow_run
        else None
    )
    gen = generate(cfg, run_id, iteration, policy, run)
    env = execute_envs(cfg, run_id, iteration, gen, run)
    rew = score_rewards(cfg, run_id, iteration, gen, env, run)
    tr = train(cfg, run_id, iteration, policy, optimizer, reference, gen, rew, run)
    due = iteration % cfg.eval.every == 0 or iteration == cfg.experiment.iterations
    ev = evaluate(cfg, run_id, iteration, tr["outputs"]["checkpoint"], run) if due else None
    if lin and run:
        lin.finish(run)
    return {
        "manifests": {"generate": gen, "execute_envs": env, "score_rewards": rew, "train": tr, "evaluate": ev}
    }
