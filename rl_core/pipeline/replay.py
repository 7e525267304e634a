"""Replay one committed stage from the inputs in its manifest, into a scratch prefix, and diff the outputs.

    report = replay(store, run_id, iteration=3, stage="train")
    report["identical"]   # True only when every output matches the stored one bit for bit
    both = replay_stages(store, run_id, 3, ["generate", "train"])   # one context: engines start once

Tables are compared cell by cell exactly (same type, same bytes: a logprob that differs in its last bit is a
difference), checkpoints tensor by tensor (max abs difference) and file by file (sha256), other artifacts by
sha256; one that was not stored (between ``train.checkpoint_every`` points) by digest, after the replay
rebuilt its inputs by re-running the train stages before it. The stored run is never written to. Which body
replays a stage comes from the stage table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from rl_core.artifacts.manifest import ArtifactRef
from rl_core.artifacts.stage import StageJob
from rl_core.artifacts.store import Store
from rl_core.pipeline.stages import STAGES, run_body
from rl_core.run.context import RunContext, run_config_hash
from rl_core.run.runs import config_for, run_config
from rl_core.schema.config import Config


def same_value(a: Any, b: Any) -> bool:
    """Exact equality of two table cells: same type and the same bits (NaN equals NaN; 0.0 is not -0.0).

    >>> same_value([0.1, -1.25], np.array([0.1, -1.25])), same_value(np.float64(0.5), 0.5)
    (True, True)
    >>> same_value(np.array([-0.25]), np.array([-0.25 + 1e-9])), same_value(0.0, -0.0)
    (False, False)
    """
    if isinstance(a, list | tuple | np.ndarray) or isinstance(b, list | tuple | np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        if x.dtype == object or y.dtype == object:
            return len(x) == len(y) and all(same_value(p, q) for p, q in zip(x, y, strict=True))
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    if isinstance(a, float | np.floating) and isinstance(b, float | np.floating):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and bool(a == b)


def diff_tables(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, Any]:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return {"identical": False, "rows": [len(a), len(b)], "columns": [list(a.columns), list(b.columns)]}
    changed_cols, changed_rows = [], set()
    for col in a.columns:
        if a[col].dtype != b[col].dtype:
            changed_cols.append(col)
            changed_rows |= set(range(len(a)))
            continue
        rows = [i for i, (x, y) in enumerate(zip(a[col], b[col], strict=True)) if not same_value(x, y)]
        if rows:
            changed_cols.append(col)
            changed_rows |= set(rows)
    return {
        "identical": not changed_cols,
        "rows": len(a),
        "rows_changed": len(changed_rows),
        "columns_changed": changed_cols,
    }


def diff_checkpoints(store: Store, a: ArtifactRef, b: ArtifactRef) -> dict[str, Any]:
    from safetensors.torch import load

    from rl_core.models.model import is_weight_file

    def read(ref: ArtifactRef, name: str) -> bytes:  # checked against the manifest: a corrupt file is named
        return store.read_bytes(ArtifactRef(uri=f"{ref.uri}/{name}", sha256=(ref.files or {})[name]))

    def tensors(ref: ArtifactRef) -> dict[str, Any]:  # one model.safetensors or every shard
        names = [n for n in ref.files or {} if is_weight_file(n) and n.endswith(".safetensors")]
        return {k: v for n in names for k, v in load(read(ref, n)).items()}

    # the stored files are what they were committed as, or the comparison would be with the manifest alone
    for name in a.files or {}:
        if not (is_weight_file(name) and name.endswith(".safetensors")):
            read(a, name)
    out: dict[str, Any] = {"identical": a.sha256 == b.sha256}
    wa, wb = tensors(a), tensors(b)
    out["max_abs_diff"] = max(float((wa[k] - wb[k]).abs().max()) for k in wa) if set(wa) == set(wb) else None
    out["files_changed"] = sorted(k for k in a.files or {} if (a.files or {})[k] != (b.files or {}).get(k))
    return out


def diff_artifact(store: Store, old: ArtifactRef, new: ArtifactRef) -> dict[str, Any]:
    if old.stored is False or new.stored is False:  # held in memory (train.checkpoint_every): digests only
        return {"identical": (old.sha256, old.files) == (new.sha256, new.files), "in_store": False}
    if old.files is not None:
        return diff_checkpoints(store, old, new)
    if old.uri.endswith(".parquet"):
        d = diff_tables(store.read_table(old), store.read_table(new))
        return {**d, "identical": old.sha256 == new.sha256 or d["identical"]}
    store.read_bytes(old)  # the stored bytes, checked against their manifest sha256 (a corrupt one is named)
    return {"identical": old.sha256 == new.sha256}


def replay(
    store: Store,
    run_id: str,
    iteration: int,
    stage: str,
    cfg: Config | None = None,
    prepare: Callable[[RunContext], None] | None = None,
    ctx: RunContext | None = None,
) -> dict[str, Any]:
    """Replay ``stage`` of ``iteration``. In ``ctx`` when given (its engines stay up for the caller, who
    closes them), else in a context of its own, closed before the outputs are compared."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}; got {stage!r}")
    spec = STAGES[stage]
    own = ctx is None
    if ctx is None:
        ctx = _context(store, run_id, cfg or config_of_stage(store, run_id, iteration, stage), prepare)
    owner = ctx.base_id if spec.base else run_id
    uri = store.stage_uri(owner, iteration, stage)
    manifest = store.read_manifest(uri)
    if manifest is None:
        raise FileNotFoundError(
            f"no committed {stage} stage at iteration {iteration} of run {run_id} ({uri})"
        )
    scratch = f"{store.root}/_replay/{run_id}/iter-{iteration:04d}/{stage}"
    store.clear(scratch)
    result = run_body(spec, ctx, StageJob(iteration, manifest.inputs, scratch))
    if own:
        ctx.held.close()
    artifacts: dict[str, Any] = {}
    for name, old in manifest.outputs.items():
        new = result.outputs[name]
        artifacts[name] = {**diff_artifact(store, old, new), "stored": old.uri, "replayed": new.uri}
    differing = [k for k, v in manifest.metrics.items() if result.metrics.get(k) != v]
    return {
        "run_id": run_id,
        "iteration": iteration,
        "stage": stage,
        "identical": all(a["identical"] for a in artifacts.values()),
        "artifacts": artifacts,
        "metrics_differing": sorted(differing),
        "scratch": scratch,
    }


def config_of_stage(store: Store, run_id: str, iteration: int, stage: str) -> Config:
    """The config the committed ``stage`` of ``iteration`` ran with: the run's config version whose hash its
    manifest carries (``rl_core.run.runs.config_for``; a base stage, or a stage not committed: the run's
    current config)."""
    spec = STAGES.get(stage)
    manifest = (
        None if spec is None or spec.base else store.read_manifest(store.stage_uri(run_id, iteration, stage))
    )
    if manifest is None:
        return run_config(store, run_id)
    return config_for(store, run_id, manifest.config_hash)


def _context(
    store: Store, run_id: str, cfg: Config | None, prepare: Callable[[RunContext], None] | None
) -> RunContext:
    ctx = RunContext(cfg or run_config(store, run_id), run_id, store)
    if prepare is not None:  # the orchestration layer's hooks (e.g. a reward server launcher)
        prepare(ctx)
    return ctx


def replay_stages(
    store: Store,
    run_id: str,
    iteration: int,
    stages: list[str],
    cfg: Config | None = None,
    prepare: Callable[[RunContext], None] | None = None,
) -> dict[str, Any]:
    """Replay several stages of one iteration, in order, in one context: the engines start once and each
    stage syncs the weights its own inputs name, as in the run (sampling is seeded per request, so what an
    engine sampled before does not change what it samples next). ``identical`` only when every stage is."""
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ValueError(f"stages must be among {', '.join(STAGES)}; got {stages!r}")
    order = list(dict.fromkeys(stages))
    ctx = _context(store, run_id, cfg or config_of_stage(store, run_id, iteration, order[0]), prepare)
    reports = {}
    try:
        for s in order:
            own = cfg or config_of_stage(store, run_id, iteration, s)
            if STAGES[s].base or run_config_hash(own) == ctx.config_hash:
                reports[s] = replay(store, run_id, iteration, s, ctx=ctx)
            else:  # committed under another config version of the run: replayed with that one
                reports[s] = replay(store, run_id, iteration, s, cfg=own, prepare=prepare)
    finally:
        ctx.held.close()
    return {
        "run_id": run_id,
        "iteration": iteration,
        "identical": all(r["identical"] for r in reports.values()),
        "stages": reports,
    }


def reward_changes(old: pd.DataFrame, new: pd.DataFrame) -> dict[str, Any]:
    """How a re-scored rewards table differs from the stored one: the mean reward and each component's mean
    before and after, how many completions' rewards changed, and the advantages (mean |change|, sign flips).

    >>> a = pd.DataFrame({"correct": [1.0, 0.0], "reward": [1.0, 0.0], "advantage": [0.7, -0.7]})
    >>> b = pd.DataFrame({"correct": [1.0, 0.0], "reward": [2.0, 0.0], "advantage": [0.7, -0.7]})
    >>> c = reward_changes(a, b)
    >>> c["reward_mean"], c["rewards_changed"], c["advantage_sign_flips"]
    ([0.5, 1.0], 1, 0)
    """
    out: dict[str, Any] = {"completions": len(old)}
    for col in [c for c in new.columns if c not in ("prompt_index", "sample_index", "advantage")]:
        if pd.api.types.is_numeric_dtype(new[col]):
            before = float(old[col].mean()) if col in old else None
            out[f"{col}_mean"] = [before, float(new[col].mean())]
    out["rewards_changed"] = int((old["reward"].to_numpy() != new["reward"].to_numpy()).sum())
    a, b = old["advantage"].to_numpy(dtype=float), new["advantage"].to_numpy(dtype=float)
    out["advantage_mean_abs_change"] = float(np.abs(a - b).mean()) if len(a) else 0.0
    out["advantage_sign_flips"] = int((np.sign(a) * np.sign(b) < 0).sum())
    return out


def update_sizes(store: Store, policy: ArtifactRef, stored: Any, remade: dict[str, ArtifactRef]) -> dict:
    """How far the stored train stage and its what-if moved the weights from the policy they started from:
    the largest change of any weight, ``[stored, what-if]`` (None for a checkpoint not in the store)."""

    def size(ckpt: ArtifactRef) -> float | None:
        if policy.stored is False or ckpt.stored is False:
            return None
        return diff_checkpoints(store, policy, ckpt)["max_abs_diff"]

    return {"max_abs_weight_change": [size(stored.outputs["checkpoint"]), size(remade["checkpoint"])]}


def what_if(
    store: Store,
    run_id: str,
    iteration: int,
    stages: list[str],
    overrides: list[str],
    prepare: Callable[[RunContext], None] | None = None,
) -> dict[str, Any]:
    """Re-run ``stages`` of ``iteration`` from their stored inputs under the config they ran with changed by
    ``overrides`` (``section.field=value``), into ``_replay/<run>/what-if-<hash>/`` (never the run). Stages
    run in order and a later one reads what an earlier one re-made (``--stage audit --stage score_rewards``:
    the new flags re-score). Reports, per stage, every metric that moved and, for rewards, what changed.

    Long: the config, the chained inputs, and the per-stage report."""
    from rl_core.schema.config import apply_overrides, config_from_dict

    order = list(dict.fromkeys(stages))
    if not order or any(s not in STAGES or STAGES[s].base for s in order):
        raise ValueError(f"what-if stages must be among the iteration stages; got {stages!r}")
    base = config_of_stage(store, run_id, iteration, order[0]).model_dump(mode="json")
    cfg = config_from_dict(apply_overrides(base, overrides), "--set")
    tag = run_config_hash(cfg)[:12]
    ctx = _context(store, run_id, cfg, prepare)
    remade: dict[str, ArtifactRef] = {}  # stored output uri -> its what-if replacement
    reports = {}
    try:
        for s in order:
            manifest = store.read_manifest(store.stage_uri(run_id, iteration, s))
            if manifest is None:
                raise FileNotFoundError(f"no committed {s} stage at iteration {iteration} of run {run_id}")
            inputs = {k: remade.get(v.uri, v) for k, v in manifest.inputs.items()}
            scratch = f"{store.root}/_replay/{run_id}/what-if-{tag}/iter-{iteration:04d}/{s}"
            store.clear(scratch)
            result = run_body(STAGES[s], ctx, StageJob(iteration, inputs, scratch))
            remade |= {manifest.outputs[k].uri: v for k, v in result.outputs.items() if k in manifest.outputs}
            moved = {  # (a figure only one side has, such as a new evaluation suite's, shows as None -> x)
                k: [manifest.metrics.get(k), result.metrics.get(k)]
                for k in {**manifest.metrics, **result.metrics}
                if isinstance(manifest.metrics.get(k, result.metrics.get(k)), int | float)
                and manifest.metrics.get(k) != result.metrics.get(k)
            }
            report: dict[str, Any] = {
                "metrics_changed": moved,
                "outputs": {k: v.uri for k, v in result.outputs.items()},
            }
            if s == "score_rewards":
                old, new = manifest.outputs["rewards"], result.outputs["rewards"]
                report["rewards"] = reward_changes(store.read_table(old), store.read_table(new))
            if s == "train":
                report["update"] = update_sizes(store, inputs["policy"], manifest, result.outputs)
            reports[s] = report
    finally:
        ctx.held.close()
    return {
        "run_id": run_id,
        "iteration": iteration,
        "overrides": overrides,
        "scratch_tag": tag,
        "stages": reports,
    }
