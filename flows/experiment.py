"""The experiment flow: build and warm up the base model, evaluate it, then run the RL iterations.

    from flows.experiment import experiment_flow
    experiment_flow(load_config("configs/default.yaml"), run_id="demo")

Each stage commits a manifest; calling this again with the same run id (``rlfoundry resume``) skips every
committed stage and continues from the first one that is not.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from flows.iteration import iteration_flow
from rl_core.config import Config
from rl_core.report import emit
from tasks.common import lineage
from tasks.evaluate import evaluate
from tasks.generate import start_rollout_engine
from tasks.init_model import init_model
from tasks.warmup import warmup


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


def summarize(iteration: int, manifests: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "iteration", "iteration": iteration, "timings": {}}
    for name, m in manifests.items():
        if m is None:
            continue
        out["timings"][name] = m["timings"]["seconds"]
    if manifests.get("score_rewards"):
        out["mean_reward"] = manifests["score_rewards"]["metrics"]["mean_reward"]
    if manifests.get("evaluate"):
        out["eval"] = manifests["evaluate"]["metrics"]
    if manifests.get("train"):
        t = manifests["train"]["metrics"]
        out["train"] = {
            k: t[k] for k in ("loss", "kl", "clip_frac", "entropy", "grad_norm", "logprob_mismatch_max")
        }
    return out


@flow(name="rl-experiment", flow_run_name="{run_id}", validate_parameters=False)
def experiment_flow(cfg: Config, run_id: str) -> dict[str, Any]:
    lin = lineage(cfg)
    from rl_core.context import get_context

    ctx = get_context(cfg, run_id)
    parent = lin.experiment_run(run_id, cfg, ctx.base_id) if lin else None
    if lin and parent:
        lin.client.set_tag(parent, "prefect.flow_run_id", flow_run.get_id() or "")
    base_run = lin.iteration_run(parent, run_id, 0, flow_run.get_id()) if lin and parent else None
    emit(
        {
            "kind": "status",
            "text": f"base model {ctx.base_id}: tokenizer + model, then {cfg.warmup.steps} warm-up steps",
        }
    )
    init = init_model(cfg, run_id, base_run)
    wu = warmup(cfg, run_id, init, base_run)
    reference = wu["outputs"]["checkpoint"]
    emit(
        {
            "kind": "status",
            "text": f"starting the {cfg.rollout.engine} rollout engine; evaluating the base model",
        }
    )
    start_rollout_engine(cfg, run_id, reference)
    ev0 = evaluate(cfg, run_id, 0, reference, base_run)
    emit(summarize(0, {"init": init, "warmup": wu, "evaluate": ev0}))
    policy, optimizer = reference, None
    last: dict[str, Any] = {"evaluate": ev0}
    for k in range(1, cfg.experiment.iterations + 1):
        res = iteration_flow(cfg, run_id, k, policy, optimizer, reference, parent)
        ms = res["manifests"]
        policy, optimizer = ms["train"]["outputs"]["checkpoint"], ms["train"]["outputs"]["optimizer"]
        summary = summarize(k, ms)
        if lin and parent:
            row = {"mean_reward": summary["mean_reward"]}
            if summary.get("eval"):
                row.update({f"eval_{m}": v for m, v in summary["eval"].items() if isinstance(v, float)})
            lin.log_summary(parent, row, k)
        emit(summary)
        last = ms
    if lin and parent:
        lin.finish(parent)
    final_eval = (last.get("evaluate") or ev0)["metrics"]
    return {
        "run_id": run_id,
        "base_accuracy": ev0["metrics"]["accuracy"],
        "final": final_eval,
        "policy": policy,
    }
