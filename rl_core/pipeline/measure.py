"""Measure a checkpoint outside any run (``rlfoundry eval``): a run's policy of one iteration, or a checkpoint
folder as Hugging Face saved it, evaluated by the evaluate stage's own body (held-out accuracy, pass@k, mean
reward and the ``eval.suites``) into the replay area, never into a run. Each result names the policy it
measured by digest (``policy_sha256``, as ``show`` and the run's manifests name policies).

    evaluate_checkpoint(store, "run-a", 3, ["eval.samples=16"], suites=["hard"])
    evaluate_folder(store, "/ckpt/qwen3-step-400", "configs/my_task.yaml", suites=["hard"])
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_core.artifacts.manifest import ArtifactRef
from rl_core.artifacts.stage import StageJob
from rl_core.artifacts.store import Store
from rl_core.pipeline.stages import STAGES, run_body
from rl_core.run.context import RunContext, run_config_hash
from rl_core.run.runs import run_config
from rl_core.schema.config import Config


def _check_suites(cfg: Config, suites: list[str] | None) -> None:
    unknown = [s for s in suites or [] if s not in cfg.eval.suites]
    if unknown:
        raise ValueError(
            f"--suite {', '.join(unknown)}: not among the config's eval.suites "
            f"({', '.join(cfg.eval.suites) or 'none'}); add one with "
            "--set 'eval.suites={NAME: {filter: {FIELD: [VALUE]}}}'"
        )


def _measure(
    ctx: RunContext, policy: ArtifactRef, scratch: str, suites: list[str] | None
) -> tuple[dict[str, Any], str]:
    """The evaluate stage's body on ``policy`` into ``scratch`` (cleared first): its metrics (only those of
    ``suites`` when given), then each ``eval.inspect`` task's (``inspect.NAME.*``, its log beside), and the
    table's URI. Closes the context's engines (before the inspect tasks start servers of their own)."""
    try:
        ctx.store.clear(scratch)
        result = run_body(STAGES["evaluate"], ctx, StageJob(0, {"policy": policy}, scratch))
    finally:
        ctx.held.close()
    metrics = dict(result.metrics)
    if ctx.cfg.eval.inspect and ctx.inspect_runner is None:
        raise RuntimeError(
            "eval.inspect: this caller cannot start the inspect-ai harness (no inspect_runner)"
        )
    served = ctx.inspect_runner(ctx, policy) if ctx.cfg.eval.inspect else None  # type: ignore[misc]
    try:
        for name in ctx.cfg.eval.inspect:
            out = f"{scratch}-inspect-{name}"
            ctx.store.clear(out)
            metrics |= served.run(StageJob(0, {"policy": policy}, out), name).metrics
    finally:
        if served is not None:
            served.close()
    if suites:
        metrics = {
            k: v
            for k, v in metrics.items()
            if k.startswith("inspect.") or any(k.startswith(f"suite.{s}.") for s in suites)
        }
    return metrics, result.outputs["eval"].uri


def _digest(policy: ArtifactRef) -> str:
    from rl_core.models.model import weights_digest

    return weights_digest(policy.files) if policy.files else policy.sha256


def evaluate_checkpoint(
    store: Store,
    run_id: str,
    iteration: int,
    overrides: list[str] | None = None,
    suites: list[str] | None = None,
    prepare: Callable[[RunContext], None] | None = None,
) -> dict[str, Any]:
    """Evaluate the policy of ``iteration`` (its train checkpoint; 0: the warmed-up base model) under the
    run's config changed by ``overrides``, into ``_replay/<run>/eval-<hash>/`` (never the run). Returns the
    metrics (only those of ``suites`` when given) with the policy version and digest they measured."""
    from rl_core.artifacts.stage import committed
    from rl_core.pipeline.stages import resolve_inputs
    from rl_core.schema.config import apply_overrides, config_from_dict

    cfg = config_from_dict(
        apply_overrides(run_config(store, run_id).model_dump(mode="json"), overrides or []), "--set"
    )
    _check_suites(cfg, suites)
    ctx = RunContext(cfg, run_id, store)
    if prepare is not None:  # the orchestration layer's hooks (e.g. a reward server launcher)
        prepare(ctx)
    spec = STAGES["evaluate"]
    try:
        inputs = resolve_inputs(
            spec,
            cfg,
            iteration,
            lambda s, k: committed(store, ctx.base_id if STAGES[s].base else run_id, k, s),
        )
    except BaseException:
        ctx.held.close()
        raise
    scratch = f"{store.root}/_replay/{run_id}/eval-{run_config_hash(cfg)[:12]}/iter-{iteration:04d}/evaluate"
    metrics, table = _measure(ctx, inputs["policy"], scratch, suites)
    policy = inputs["policy"]
    return {
        "run_id": run_id,
        "iteration": iteration,
        "policy_version": iteration,
        "policy": policy.uri,
        "policy_sha256": _digest(policy),
        "metrics": metrics,
        "table": table,
    }


def evaluate_folder(
    store: Store,
    folder: str,
    config: str | Path,
    overrides: list[str] | None = None,
    suites: list[str] | None = None,
    prepare: Callable[[RunContext], None] | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint folder (local or a store URI, as ``model.path`` takes it: checked the same way,
    a bad folder is a ConfigError naming what is wrong) on the task, engine and eval settings of ``config``
    changed by ``overrides``. The folder is copied byte for byte into
    ``_replay/_eval/<folder-hash>/eval-<config-hash>/policy`` and measured there, so the result names the
    digest of exactly the bytes it measured (the same ``policy_sha256`` a run started from that folder with
    ``warmup.steps: 0`` gives its base policy)."""
    from rl_core.models.policy_folder import check_model_section, fetch_policy_folder
    from rl_core.schema.config import load_config

    cfg = load_config(config, [*(overrides or []), f"model.path={folder}"])
    _check_suites(cfg, suites)
    where = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    scratch = f"{store.root}/_replay/_eval/{where}/eval-{run_config_hash(cfg)[:12]}"
    ctx = RunContext(cfg, f"_eval/{where}", store)
    check_model_section(cfg, ctx.placement.rollout_engine)
    if prepare is not None:
        prepare(ctx)
    try:
        store.clear(scratch)
        with tempfile.TemporaryDirectory() as d:
            policy = store.put_dir(fetch_policy_folder(folder, d), f"{scratch}/policy")
    except BaseException:
        ctx.held.close()
        raise
    metrics, table = _measure(ctx, policy, f"{scratch}/evaluate", suites)
    return {
        "folder": str(folder),
        "config": str(config),
        "policy": policy.uri,
        "policy_sha256": _digest(policy),
        "metrics": metrics,
        "table": table,
    }
