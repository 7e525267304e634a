"""The flows that ``rlfoundry serve`` registers as Prefect deployments, for the Prefect UI and API.

- ``experiment``: one parameter ``config`` typed by the pydantic Config, so the UI renders it as a form with
  every field's default and description; ``run_id`` optional (a new id when empty; an existing run with the
  same config is resumed: ``rl_core.runs.create_or_resume``, the rule ``rlfoundry run`` / ``resume`` follow).
- ``evaluation-sweep`` (cron): evaluates every checkpoint of the chosen runs that has no evaluation yet. A
  checkpoint the run already evaluated is reused; a new one is evaluated into ``<run>/sweep/iter-K/evaluate``
  (commit-or-skip like every stage, so each checkpoint is evaluated once however often the sweep fires).
- ``replay``: ``rlfoundry replay`` as a flow; the run fails when the replay differs.

Each posts a Prefect artifact (a markdown table) to its flow run, so the result is readable in the UI.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from rl_core.config import Config
from rl_core.runs import OptionalRunId, RunId, check_run_id
from rl_core.stages import STAGES

StageName = Literal[tuple(STAGES)]  # type: ignore[valid-type]  (the stage table's names: the form's choices)


@flow(name="experiment", validate_parameters=True)
def experiment(config: Config, run_id: OptionalRunId = "") -> dict[str, Any]:
    """Run an RL experiment end to end (init, warm-up, RL iterations, evaluation).

    Args:
        config: The experiment; every field is described and defaults to the served config file.
        run_id: Run id; empty starts a new run. An existing id with the same config resumes it.
    """
    if run_id:
        check_run_id(run_id)  # also when called as a plain function, before anything is read or written
    from flows.experiment import experiment_flow, with_result_storage
    from rl_core.context import RunContext
    from rl_core.runs import create_or_resume, new_run_id

    rid = run_id or new_run_id()
    ctx = RunContext(config, rid)
    if create_or_resume(ctx, "either") == "resumed":
        get_run_logger().info("run %s exists with this config: resuming it", rid)
    result = with_result_storage(experiment_flow, ctx.store)(config, rid)
    create_markdown_artifact(
        f"run `{rid}`: held-out accuracy {result['base_accuracy']:.3f} (base) -> "
        f"{result['final']['accuracy']:.3f}\n\n"
        f"artifacts: `{ctx.store.run_uri(rid)}`",
        key="experiment-result",
    )
    return {"run_id": rid, "base_accuracy": result["base_accuracy"], "final": result["final"]}


def _is_run_id(name: str) -> bool:
    """A folder of the store that can be a run (not the store's own ``_base``, ``_prefect``, ...)."""
    try:
        check_run_id(name)
    except ValueError:
        return False
    return True


def _store(store: str) -> Any:
    from rl_core.config import load_config
    from rl_core.context import open_store

    return open_store(load_config(), store or None)


@flow(name="evaluation-sweep")
def evaluation_sweep(
    run_ids: list[RunId] | None = None, store: str = ""
) -> dict[str, dict[int, dict[str, Any]]]:
    """Evaluate every checkpoint of the chosen runs that has not been evaluated yet.

    Args:
        run_ids: Runs to sweep; empty = every run in the store.
        store: Store root; empty = the configured one.
    """
    for rid in run_ids or []:
        check_run_id(rid)
    st = _store(store)
    runs = run_ids or [r for r in st.list_runs() if _is_run_id(r)]
    out = {rid: _sweep_run(st, rid) for rid in runs}
    rows = [
        f"| {r} | {k} | {v['accuracy']:.3f} | {v['source']} |"
        for r, its in out.items()
        for k, v in its.items()
    ]
    create_markdown_artifact(
        "| run | iteration | accuracy | evaluated by |\n|---|---|---|---|\n" + "\n".join(rows),
        key="evaluation-sweep",
    )
    return out


def _sweep_run(st: Any, rid: str) -> dict[int, dict[str, Any]]:
    """{iteration: accuracy and who evaluated it} for every trained checkpoint of run ``rid``."""
    from rl_core.context import RunContext
    from rl_core.evaluate import evaluate_body
    from rl_core.runs import run_config
    from rl_core.stage import committed, run_stage

    cfg = run_config(st, rid)
    ctx = RunContext(cfg, rid, store=st)
    out: dict[int, dict[str, Any]] = {}
    for k in range(1, cfg.experiment.iterations + 1):
        tr = committed(st, rid, k, "train")
        if tr is None:
            break  # iterations commit in order: nothing newer
        ckpt = tr.outputs["checkpoint"]
        own = committed(st, rid, k, "evaluate")
        if own is not None and own.inputs["policy"].sha256 == ckpt.sha256:
            m, source = own, "run"
        else:
            m = run_stage(
                st,
                f"{rid}/sweep",
                k,
                "evaluate",
                ctx.config_hash,
                {"policy": ckpt},
                lambda job, c=ctx: evaluate_body(c, job),
            )
            source = "sweep (reused)" if m.reused else "sweep (new)"
        out[k] = {"accuracy": m.metrics["accuracy"], "source": source}
    return out


@flow(name="replay")
def replay_stage(
    run_id: RunId,
    iteration: Annotated[int, Field(ge=0)] = 1,
    stage: StageName = "train",
    store: str = "",
) -> dict[str, Any]:
    """Re-execute one stage from its stored inputs into a scratch prefix and compare with the stored outputs.

    Args:
        run_id: Run to replay from.
        iteration: Iteration (0 = the base model's evaluation).
        stage: Stage to replay.
        store: Store root; empty = the configured one.
    """
    import json

    from rl_core.replay import replay

    check_run_id(run_id)
    report = replay(_store(store), run_id, iteration, stage)
    create_markdown_artifact(
        f"replay of `{run_id}` iteration {iteration} `{stage}`: "
        f"**{'identical' if report['identical'] else 'DIFFERENT'}**"
        f"\n\n```json\n{json.dumps(report['artifacts'], indent=1, default=str)}\n```",
        key="replay",
    )
    if not report["identical"]:
        raise RuntimeError(f"replay of {run_id} iteration {iteration} {stage} differs: {report['artifacts']}")
    return report


def deployments(config: Config, *, sweep_runs: list[str], sweep_cron: str, store: str) -> list[Any]:
    """The three deployments, with the experiment form defaulting to ``config``."""
    return [
        experiment.to_deployment(
            name="experiment",
            parameters={"config": config.model_dump(mode="json"), "run_id": ""},
            description="An RL experiment: edit any config field in the form.",
        ),
        evaluation_sweep.to_deployment(
            name="evaluation-sweep",
            cron=sweep_cron,
            parameters={"run_ids": sweep_runs, "store": store},
            description="Evaluates new checkpoints of the chosen runs on a schedule.",
        ),
        replay_stage.to_deployment(
            name="replay",
            parameters={"store": store},
            description="Replays one stage and diffs it with the stored outputs.",
        ),
    ]
