"""Replay one committed stage from the inputs in its manifest, into a scratch prefix, and diff the outputs.

    report = replay(store, run_id, iteration=3, stage="train")
    report["identical"]   # True when every output matches the stored one bit for bit

Tables are compared row by row (rows changed, columns that differ), checkpoints tensor by tensor (max abs
difference), other artifacts by sha256. The stored run is never written to.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from rl_core.config import Config
from rl_core.context import RunContext
from rl_core.runs import run_config
from rl_core.stage import STAGES, StageResult, ref_of
from rl_core.store import Store


def _body(ctx: RunContext, iteration: int, stage: str, inputs: dict[str, Any]) -> Any:
    from rl_core.episodes import execute_envs_body, generate_body, score_rewards_body
    from rl_core.evaluate import evaluate_body
    from rl_core.train import train_body

    bodies = {
        "generate": lambda uri: generate_body(ctx, iteration, inputs["policy"], uri),
        "execute_envs": lambda uri: execute_envs_body(ctx, inputs["rollouts"], uri),
        "score_rewards": lambda uri: score_rewards_body(ctx, inputs["rollouts"], inputs["env_results"], uri),
        "train": lambda uri: train_body(ctx, iteration, inputs, uri),
        "evaluate": lambda uri: evaluate_body(ctx, iteration, inputs["policy"], uri),
    }
    return bodies[stage]


def diff_tables(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, Any]:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return {"identical": False, "rows": [len(a), len(b)], "columns": [list(a.columns), list(b.columns)]}
    changed_cols, changed_rows = [], set()
    for col in a.columns:
        left, right = a[col].map(repr), b[col].map(repr)
        neq = left != right
        if neq.any():
            changed_cols.append(col)
            changed_rows |= set(neq[neq].index.tolist())
    return {
        "identical": not changed_cols,
        "rows": len(a),
        "rows_changed": len(changed_rows),
        "columns_changed": changed_cols,
    }


def diff_checkpoints(store: Store, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    from safetensors.torch import load

    out: dict[str, Any] = {"identical": a["sha256"] == b["sha256"]}
    wa = load(store.read_bytes(f"{a['uri']}/model.safetensors"))
    wb = load(store.read_bytes(f"{b['uri']}/model.safetensors"))
    out["max_abs_diff"] = max(float((wa[k] - wb[k]).abs().max()) for k in wa) if set(wa) == set(wb) else None
    out["files_changed"] = sorted(k for k in a["files"] if a["files"][k] != b["files"].get(k))
    return out


def replay(
    store: Store, run_id: str, iteration: int, stage: str, cfg: Config | None = None
) -> dict[str, Any]:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}; got {stage!r}")
    uri = store.stage_uri(run_id, iteration, stage)
    manifest = store.read_manifest(uri)
    if manifest is None:
        raise FileNotFoundError(
            f"no committed {stage} stage at iteration {iteration} of run {run_id} ({uri})"
        )
    cfg = cfg or run_config(store, run_id)
    ctx = RunContext(cfg, run_id, store)
    scratch = f"{store.root}/_replay/{run_id}/iter-{iteration:04d}/{stage}"
    store.clear(scratch)
    result: StageResult = _body(ctx, iteration, stage, manifest["inputs"])(scratch)
    artifacts: dict[str, Any] = {}
    for name, old in manifest["outputs"].items():
        new = result.outputs[name]
        if "files" in old:
            artifacts[name] = diff_checkpoints(store, old, new)
        elif old["uri"].endswith(".parquet"):
            d = diff_tables(store.read_table(ref_of(old)), store.read_table(ref_of(new)))
            artifacts[name] = {**d, "identical": old["sha256"] == new["sha256"] or d["identical"]}
        else:
            artifacts[name] = {"identical": old["sha256"] == new["sha256"]}
        artifacts[name].update(stored=old["uri"], replayed=new["uri"])
    differing = [k for k, v in manifest["metrics"].items() if result.metrics.get(k) != v]
    return {
        "run_id": run_id,
        "iteration": iteration,
        "stage": stage,
        "identical": all(a["identical"] for a in artifacts.values()),
        "artifacts": artifacts,
        "metrics_differing": sorted(differing),
        "scratch": scratch,
    }
