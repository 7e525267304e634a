"""The experiment flow: build and warm up the base model, evaluate it, then run the RL iterations.

    from flows.experiment import experiment_flow
    experiment_flow(load_config("configs/default.yaml"), run_id="demo")

Each stage commits a manifest; calling this again with the same run id (``rlfoundry resume``) skips every
committed stage and continues from the first one that is not.
"""

from __future__ import annotations

import functools
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from flows.iteration import run_iterations
from flows.observe import AlarmStop, RecordWindow, attach_later, report_iteration
from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.report import emit, subscribe
from rl_core.pipeline.stages import STAGES
from rl_core.run.context import store_root
from rl_core.run.lineage_jobs import lineage, log_summary
from rl_core.schema.config import Config
from tasks.common import close_run, context, lineage_writer, run_logger, task_for
from tasks.generate import start_rollout_engine


def with_result_storage(fl: Any, store: Any) -> Any:
    """``fl`` persisting its Prefect results beside the run's artifacts when the store is remote (S3).

    The storage is a RemoteFileSystem block saved on the Prefect server; it holds only the s3:// path: s3fs
    takes the endpoint and credentials from the environment, so none reach Prefect."""
    if store.is_local:
        return fl
    import hashlib

    from prefect.filesystems import RemoteFileSystem

    basepath = f"{store.root}/_prefect"
    name = "rlfoundry-results-" + hashlib.sha256(basepath.encode()).hexdigest()[:12]
    # botocore's standard retry mode with the store's attempt count (exponential backoff, capped at 20 s), in
    # place of its default, which spent ~20 s on every write once the endpoint was gone.
    retries = {"mode": "standard", "total_max_attempts": store.retries}
    settings = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": retries}}
    RemoteFileSystem(basepath=basepath, settings=settings).save(name, overwrite=True)
    return fl.with_options(result_storage=f"remote-file-system/{name}", persist_result=True)


# The vital signs the experiment's parent MLflow run charts beside the mean reward (every one of them is in
# each iteration's own MLflow run, as vitals/<name>).
SUMMARY_VITALS = ("reward_std", "kl", "entropy", "length_mean", "truncation_rate", "alarms")


def summarize(iteration: int, manifests: dict[str, Manifest | None]) -> dict[str, Any]:
    """One line of the run's progress: each stage's seconds and the metrics its table entry summarises
    (``"*"``: all of them), by stage: ``score_rewards`` gives the mean reward, ``evaluate`` the eval."""
    out: dict[str, Any] = {"kind": "iteration", "iteration": iteration, "timings": {}}
    for name, m in manifests.items():
        if m is None:
            continue
        out["timings"][name] = m.timings.seconds
        keys = STAGES[name].summary
        picked = dict(m.metrics) if keys == ("*",) else {k: m.metrics[k] for k in keys if k in m.metrics}
        if name == "score_rewards":
            out["mean_reward"] = picked["mean_reward"]
        elif name == "evaluate":
            out["eval"] = picked
        elif name == "vitals":
            out["vitals"] = {k: v for k, v in m.metrics.items() if isinstance(v, int | float)}
            out["alarms"] = m.metrics.get("alarm_list", [])
        elif picked:
            out[name] = picked
    return out


def _report(
    cfg: Config,
    run_id: str,
    parent: str | None,
    k: int,
    ms: dict[str, Manifest | None],
    it_run: str | None,
    window: RecordWindow,
) -> None:
    """Iteration k's summary to the listeners (the CLI), MLflow's parent run and the Prefect UI; its alarms
    (``flows.observe.report_iteration``: a stop alarm raises ``AlarmStop``). The parent run's row and the
    vital-sign table go out together with those of the iterations ``window`` held (``RecordWindow``)."""
    lin = lineage(cfg)
    summary = summarize(k, ms)
    summary["mlflow_run"] = lin.link(it_run) if lin and it_run else None
    last = k == cfg.experiment.iterations
    due = window.add(dict(summary), at_once=last or bool(summary.get("alarms")))
    _write_rows(cfg, parent, k, due)
    summary["tables"] = due  # (for the deployment's flow run: flows.observe.mirror)
    try:
        emit(summary)
    finally:
        summary.pop("tables")

    def later(fn: Any) -> Any:
        return lineage_writer(cfg).submit(k, fn)

    report_iteration(run_id, k, summary, ms.get("vitals"), later, store_root(cfg), due)


def _parent_row(summary: dict[str, Any]) -> dict[str, float]:
    """What the experiment's MLflow run charts for an iteration: its mean reward, eval metrics and the
    SUMMARY_VITALS."""
    row = {"mean_reward": summary["mean_reward"]}
    if summary.get("eval"):
        row.update({f"eval_{m}": v for m, v in summary["eval"].items() if isinstance(v, float)})
    row.update({n: v for n, v in summary.get("vitals", {}).items() if n in SUMMARY_VITALS})
    return row


def _write_rows(cfg: Config, parent: str | None, k: int, due: list[dict[str, Any]]) -> None:
    """The parent run's rows of the ``due`` iterations, in one MLflow call, on the lineage writer."""
    if lineage(cfg) and parent and due:
        rows = [(s["iteration"], _parent_row(s)) for s in due]
        lineage_writer(cfg).submit(k, functools.partial(log_summary, cfg, parent, rows))


def _write_held(cfg: Config, run_id: str, parent: str | None, window: RecordWindow) -> None:
    """What ``window`` still holds (the run stops or fails), handed to the lineage writer: the parent run's
    rows, the vital-sign table. (A run that fails does not wait for the writer: what it had not written is
    written again by ``rlfoundry resume``, as every committed iteration's records are.)"""
    held = window.take()
    if held:
        k = held[-1]["iteration"]
        _write_rows(cfg, parent, k, held)
        attach_later(run_id, held, functools.partial(lineage_writer(cfg).submit, k))


@flow(name="rl-experiment", flow_run_name="{run_id}", validate_parameters=False)
def experiment_flow(cfg: Config, run_id: str) -> dict[str, Any]:
    """The experiment; its status events are also log lines of the flow run (the Prefect UI shows them)."""
    log = run_logger()
    stop = subscribe(lambda ev: log.info(ev["text"]) if ev["kind"] == "status" else None)
    try:
        return _experiment(cfg, run_id)
    finally:
        stop()


def _open(cfg: Config, run_id: str) -> tuple[Any, Any, str | None, str | None]:
    """The run's context, its lineage (None with tracking off), its experiment's MLflow run and the base
    stages' run. The lineage writer's process (``tracking.writes``) is started first: it imports while the
    context is built and the engines start."""
    lin = lineage(cfg)
    if lin:
        lineage_writer(cfg).start()
    ctx = context(cfg, run_id)
    if not lin:
        return ctx, None, None, None
    parent = lin.experiment_run(run_id, cfg, ctx.base_id)
    lin.client.set_tag(parent, "prefect.flow_run_id", flow_run.get_id() or "")
    return ctx, lin, parent, lin.iteration_run(parent, run_id, 0, flow_run.get_id())


def _experiment(cfg: Config, run_id: str) -> dict[str, Any]:
    ctx, lin, parent, base_run = _open(cfg, run_id)
    emit(
        {
            "kind": "status",
            "text": f"base model {ctx.base_id}: tokenizer + model, then {cfg.warmup.steps} warm-up steps",
        }
    )
    init = task_for("init")(quote(cfg), run_id, 0, base_run)
    wu = task_for("warmup")(quote(cfg), run_id, 0, base_run)
    emit(
        {
            "kind": "status",
            "text": f"starting the {ctx.placement.rollout_engine} rollout engine "
            f"({ctx.placement.engine_reason}); evaluating the base model",
        }
    )
    start_rollout_engine(cfg, run_id)
    ev0 = task_for("evaluate")(quote(cfg), run_id, 0, base_run)
    if lin and base_run:
        close_run(cfg, run_id, 0, base_run)
    emit(summarize(0, {"init": init, "warmup": wu, "evaluate": ev0}))
    policy = wu.outputs["checkpoint"]
    last: dict[str, Manifest | None] = {"evaluate": ev0}
    window = RecordWindow(cfg.tracking.summary_every_s)
    try:
        for k, ms, it_run in run_iterations(cfg, run_id, parent, str(flow_run.get_id() or "")):
            policy = ms["train"].outputs["checkpoint"]
            _report(cfg, run_id, parent, k, ms, it_run, window)
            last = ms
    except AlarmStop:  # the iteration is committed: its lineage is written, the MLflow run marked stopped
        _write_held(cfg, run_id, parent, window)
        lineage_writer(cfg).close()  # and its vital-sign tables attached
        if lin and parent:
            lin.finish(parent, "KILLED")
        raise
    except Exception:  # a stage failed: the committed iterations' records still go out
        _write_held(cfg, run_id, parent, window)
        raise
    final_eval = (last.get("evaluate") or ev0).metrics
    lineage_writer(cfg).close()  # every record written, the writer (its process) ended
    if lin and parent:
        if policy.stored is not False:  # the run's final policy, promoted in MLflow's model registry
            k = cfg.experiment.iterations
            version = lin.promote(f"rlfoundry-{cfg.experiment.name}", run_id, k, policy, final_eval)
            if version is not None:
                run_logger().info(
                    "final policy registered: rlfoundry-%s version %s", cfg.experiment.name, version
                )
        lin.finish(parent)
    return {
        "run_id": run_id,
        "base_accuracy": ev0.metrics["accuracy"],
        "final": final_eval,
        "policy": policy.model_dump(),
    }
