"""The flows that ``rlfoundry serve`` registers as Prefect deployments, for the Prefect UI and API.

- ``experiment``: one parameter ``config`` typed by the pydantic Config, so the UI renders it as a form with
  every field's default and description; ``run_id`` optional (a new id when empty; an existing run with the
  same config is resumed: ``rl_core.run.runs.create_or_resume``, the rule ``rlfoundry run`` / ``resume``
  follow).
- ``evaluation-sweep`` (cron): evaluates every checkpoint of the chosen runs that has no evaluation yet. A
  checkpoint the run already evaluated is reused; a new one is evaluated into ``<run>/sweep/iter-K/evaluate``
  (commit-or-skip like every stage, so each checkpoint is evaluated once however often the sweep fires).
- ``replay``: ``rlfoundry replay`` as a flow; the run fails when the replay differs.

Each posts a Prefect artifact (a markdown table) to its flow run, so the result is readable in the UI.

Two ways to execute their runs: ``rlfoundry serve`` (a Prefect runner in that process, ``deployments``) or
``rlfoundry deploy --work-pool NAME`` (``deploy_to_pool``: the same deployments on a Prefect work pool, whose
workers start each flow run as a process, from this project's source, or as a Kubernetes Job of the project's
image; the pool is created when missing).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from flows.form_policy import FormPolicy
from rl_core.pipeline.stages import STAGES
from rl_core.run.runs import OptionalRunId, RunId, check_run_id
from rl_core.schema.config import Config, config_from_dict
from rl_core.schema.config_eval import InspectTask

StageName = Literal[tuple(STAGES)]  # type: ignore[valid-type]  (the stage table's names: the form's choices)


# validate_parameters=False: the form's config arrives as JSON and is checked against the deployment's policy
# (flows.form_policy) before it is validated, because validating a config imports the code it names.
@flow(name="experiment", validate_parameters=False)
def experiment(config: Config, run_id: OptionalRunId = "") -> dict[str, Any]:
    """Run an RL experiment end to end (init, warm-up, RL iterations, evaluation).

    Args:
        config: The experiment; every field is described and defaults to the served config file.
        run_id: Run id; empty starts a new run. An existing id with the same config resumes it.
    """
    if not isinstance(run_id, str):
        raise ValueError(f"run_id: expected a string, got {type(run_id).__name__}")
    if run_id:
        check_run_id(run_id)  # also when called as a plain function, before anything is read or written
    if not isinstance(config, Config):
        from flows.form_policy import deployment_policy

        policy = deployment_policy()
        if policy is not None:
            policy.check(config)
    data = config.model_dump(mode="json") if isinstance(config, Config) else config
    config = config_from_dict(data, "the form")  # load_config's checks, the cross-field ones too
    from flows.experiment import experiment_flow, with_result_storage
    from flows.observe import mirror
    from rl_core.artifacts.report import subscribe
    from rl_core.run.context import RunContext
    from rl_core.run.run_lock import holding_run
    from rl_core.run.runs import create_or_resume, new_run_id

    rid = run_id or new_run_id()
    ctx = RunContext(config, rid)
    with holding_run(ctx):  # one process at a time runs a run (another flow run of it is refused)
        if create_or_resume(ctx, "either") == "resumed":
            get_run_logger().info("run %s exists with this config: resuming it", rid)
        stop = subscribe(mirror(rid))  # this flow run's page shows the run's lines and tables too
        try:
            result = with_result_storage(experiment_flow, ctx.store)(config, rid)
        finally:
            stop()
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


def _check_store(store: str) -> None:
    """The sweep's and replay's ``store`` against the deployment's policy (flows.form_policy)."""
    from flows.form_policy import deployment_policy

    policy = deployment_policy()
    if policy is not None:
        policy.check_store(store)


def _check_inspect(inspect: dict[str, Any] | None) -> None:
    """The sweep's inspect-ai tasks against the deployment's policy: built-in tasks, datasets under its
    roots (flows.form_policy)."""
    from flows.form_policy import deployment_policy

    policy = deployment_policy()
    if policy is not None and inspect:
        policy.check_inspect({k: v.model_dump(mode="json") for k, v in inspect.items()}, "inspect")


def _store(store: str) -> Any:
    from rl_core.run.context import open_store
    from rl_core.schema.config import load_config

    return open_store(load_config(), store or None, "store")  # a form's store: held as --store is


@flow(name="evaluation-sweep")
def evaluation_sweep(
    run_ids: list[RunId] | None = None, store: str = "", inspect: dict[str, InspectTask] | None = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """Evaluate every checkpoint of the chosen runs that has not been evaluated yet.

    Args:
        run_ids: Runs to sweep; empty = every run in the store.
        store: Store root; empty = the configured one.
        inspect: inspect-ai tasks to run on every checkpoint, besides each run's own eval.inspect.
    """
    for rid in run_ids or []:
        check_run_id(rid)
    _check_store(store)
    _check_inspect(inspect)
    st = _store(store)
    runs = run_ids or [r for r in st.list_runs() if _is_run_id(r)]
    out, unswept = _sweep_runs(st, runs, inspect or {})
    from infra.inspect_harness import scores_cell  # (imports rl_core: after the store check)

    rows = [
        f"| {r} | {k} | {v['accuracy']:.3f} | {v['source']} | {scores_cell(v)} |"
        for r, its in out.items()
        for k, v in its.items()
    ]
    rows += [f"| {r} | - | - | not swept: {why} | |" for r, why in unswept.items()]
    create_markdown_artifact(
        "| run | iteration | accuracy | evaluated by | inspect-ai |\n|---|---|---|---|---|\n"
        + "\n".join(rows),
        key="evaluation-sweep",
    )
    return out


def _sweep_runs(
    st: Any, runs: list[str], inspect: dict[str, Any]
) -> tuple[dict[str, dict[int, dict[str, Any]]], dict[str, str]]:
    """Each run swept (``_sweep_run``); one whose record is unreadable or invalid (a corrupt ``run.json``, a
    config an older version accepted) is listed with why, and the others are swept all the same."""
    from rl_core.artifacts.store import ArtifactError
    from rl_core.run.runs import RunError
    from rl_core.schema.config import ConfigError

    out: dict[str, dict[int, dict[str, Any]]] = {}
    unswept: dict[str, str] = {}
    for rid in runs:
        try:
            out[rid] = _sweep_run(st, rid, inspect)
        except (RunError, ConfigError, ArtifactError) as e:
            unswept[rid] = str(e).replace("\n", " ").replace("|", "/")[:300]
            logging.getLogger("rlfoundry.sweep").warning("run %s not swept: %s", rid, unswept[rid])
    return out, unswept


def _sweep_run(st: Any, rid: str, inspect: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """{iteration: accuracy and who evaluated it, and the inspect-ai scores} for every trained checkpoint of
    run ``rid``: its own ``eval.inspect`` tasks and ``inspect``'s."""
    from infra.inspect_harness import sweep_tasks
    from rl_core.artifacts.stage import committed, run_stage
    from rl_core.evaluation.evaluate import evaluate_body
    from rl_core.run.context import RunContext
    from rl_core.run.runs import run_config

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
                ctx.accepted_hashes,
            )
            source = "sweep (reused)" if m.reused else "sweep (new)"
        tasks = {**ctx.cfg.eval.inspect, **inspect}
        out[k] = {"accuracy": m.metrics["accuracy"], "source": source} | sweep_tasks(ctx, rid, k, ckpt, tasks)
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

    from rl_core.pipeline.replay import replay
    from tasks.common import replay_hooks

    check_run_id(run_id)
    _check_store(store)
    report = replay(_store(store), run_id, iteration, stage, prepare=replay_hooks)
    create_markdown_artifact(
        f"replay of `{run_id}` iteration {iteration} `{stage}`: "
        f"**{'identical' if report['identical'] else 'DIFFERENT'}**"
        f"\n\n```json\n{json.dumps(report['artifacts'], indent=1, default=str)}\n```",
        key="replay",
    )
    if not report["identical"]:
        raise RuntimeError(f"replay of {run_id} iteration {iteration} {stage} differs: {report['artifacts']}")
    return report


def deployments(
    config: Config,
    *,
    sweep_runs: list[str],
    sweep_cron: str,
    store: str,
    source: Path | None = None,
    policy: FormPolicy | None = None,
) -> list[Any]:
    """The three deployments, with the experiment form defaulting to ``config`` and held to ``policy``
    (default: ``FormPolicy.served(config, store=store)``: the served store, paths and servers, the
    registered environment and reward names).

    ``source``: the project folder a work pool's process worker loads the flows from (its absolute path is
    the deployments' working directory; entrypoints are relative to it); None for a runner in this process
    or an image.
    """
    from prefect.utilities.callables import ParameterSchema

    policy = policy or FormPolicy.served(config, store=store)
    flows = (experiment, evaluation_sweep, replay_stage)
    if source is not None:
        from prefect import Flow

        flows = tuple(Flow.from_source(str(source), f"flows/deployments.py:{f.fn.__name__}") for f in flows)
    exp, sweep, rep = flows
    made = [
        exp.to_deployment(
            name="experiment",
            parameters={"config": config.model_dump(mode="json"), "run_id": ""},
            description="An RL experiment: edit any config field in the form.",
        ),
        sweep.to_deployment(
            name="evaluation-sweep",
            cron=sweep_cron,
            parameters={"run_ids": sweep_runs, "store": store},
            description="Evaluates new checkpoints of the chosen runs on a schedule.",
        ),
        rep.to_deployment(
            name="replay",
            parameters={"store": store},
            description="Replays one stage and diffs it with the stored outputs.",
        ),
    ]
    for d in made:  # the policy in the schema the Prefect server enforces and the form renders
        schema = d._parameter_openapi_schema.model_dump()
        d._parameter_openapi_schema = ParameterSchema(**policy.constrain(schema))
        d.enforce_parameter_schema = True
    return made


# -- work pools ----------------------------------------------------------------------------------------------
POOL_TYPES = ("process", "kubernetes")
K8S_POOL = "rlfoundry-k8s"  # the pool infra/k8s/prefect-worker.yaml's worker polls
K8S_IMAGE = "ghcr.io/rlfoundry/rlfoundry:latest"  # placeholder, as in infra/k8s (kustomization.yaml images:)
K8S_NAMESPACE = "rlfoundry"


class WorkPoolError(ValueError):
    """A work pool that cannot be used as asked (another type, no job template for the type)."""


def worker_command(pool: str, pool_type: str) -> list[str]:
    """The worker a user starts for ``pool`` (on Kubernetes: the one infra/k8s/prefect-worker.yaml runs)."""
    return ["prefect", "worker", "start", "--pool", pool, "--type", pool_type]


def kubernetes_template(template: dict[str, Any]) -> dict[str, Any]:
    """Prefect's Kubernetes job template adapted to infra/k8s: Jobs in the ``rlfoundry`` namespace, pods
    labelled as flow runs (the rollout servers admit only flow-run and trainer pods), the environment of
    the ``rlfoundry-config`` ConfigMap, the ``rlfoundry-s3`` Secret (optional: workload identity needs
    none), the rollout servers' token (``rlfoundry-rollout-token``, optional) and the Ray cluster's
    (``rlfoundry-ray-auth``, optional; RAY_AUTH_MODE=token: infra/k8s/ray-cluster.yaml has auth on)."""
    variables = template["variables"]["properties"]
    variables["namespace"]["default"] = K8S_NAMESPACE
    variables["image"]["default"] = K8S_IMAGE
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]
    pod.setdefault("metadata", {})["labels"] = {
        "app.kubernetes.io/part-of": "rlfoundry",
        "app.kubernetes.io/component": "flow-run",
    }
    pod["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "rlfoundry-config"}},
        {"secretRef": {"name": "rlfoundry-s3", "optional": True}},
        {"secretRef": {"name": "rlfoundry-rollout-token", "optional": True}},  # RLFOUNDRY_ROLLOUT_TOKEN
        {"secretRef": {"name": "rlfoundry-ray-auth", "optional": True}},  # RAY_AUTH_TOKEN (ray-cluster.yaml)
    ]
    # A driver of infra/k8s/ray-cluster.yaml (cluster.ray_address) authenticates with that cluster's token
    # (the container's env is Prefect's variable: its default, which a deployment's job variables may extend).
    variables["env"]["default"] = {**(variables["env"].get("default") or {}), "RAY_AUTH_MODE": "token"}
    return template


def ensure_work_pool(client: Any, name: str, pool_type: str) -> bool:
    """Create work pool ``name`` of ``pool_type`` unless it exists (then it must be of that type); True when
    created. Nothing is created when the type's job template cannot be had."""
    import asyncio

    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    try:
        pool = client.read_work_pool(name)
    except ObjectNotFound:
        pass
    else:
        if pool.type != pool_type:
            raise WorkPoolError(f"work pool {name!r} exists with type {pool.type!r}, not {pool_type!r}")
        return False
    template = asyncio.run(get_default_base_job_template_for_infrastructure_type(pool_type))
    if not template:
        raise WorkPoolError(
            f"no job template for work pool type {pool_type!r}: is its Prefect worker installed?"
        )
    if pool_type == "kubernetes":
        template = kubernetes_template(template)
    client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, base_job_template=template))
    return True


def deploy_to_pool(
    config: Config,
    *,
    pool: str,
    pool_type: str,
    sweep_runs: list[str],
    sweep_cron: str,
    store: str,
    image: str = K8S_IMAGE,
    policy: FormPolicy | None = None,
) -> bool:
    """Register the three deployments to work pool ``pool`` (created when missing; True then).

    A process pool's worker loads the flows from this project's folder (``Flow.from_source``) and runs them
    with its own interpreter, the project's venv; a Kubernetes pool's Jobs run ``image``, whose working
    directory must be the project root (the entrypoints are relative to it). Call with the project root as
    the working directory.
    """
    from prefect.client.orchestration import get_client

    from rl_core.artifacts.paths import PROJECT_ROOT

    if pool_type not in POOL_TYPES:
        raise WorkPoolError(f"work pool type {pool_type!r} is not one of {', '.join(POOL_TYPES)}")
    with get_client(sync_client=True) as client:
        created = ensure_work_pool(client, pool, pool_type)
    source = PROJECT_ROOT if pool_type == "process" else None
    made = deployments(
        config, sweep_runs=sweep_runs, sweep_cron=sweep_cron, store=store, source=source, policy=policy
    )
    for d in made:
        d.apply(work_pool_name=pool, image=None if source else image)
    return created
