"""The stage contract: run a stage once, commit it with a manifest, skip it when it is already committed.

A stage run is (run id, iteration, stage). ``run_stage`` looks for its manifest: when it exists and records
the same inputs and config hash, the stage is done and its manifest is returned as is. Anything else in the
folder is garbage from a crashed attempt and is cleared. The stage body writes its outputs and returns their
refs; the manifest (inputs, outputs with sha256, config hash, code version, seeds, timings, metrics) is
written last, atomically.

    m = run_stage(store, "run1", 3, "generate", cfg_hash, inputs={"policy": ckpt_entry}, body=fn)
"""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_core.faults import fault, set_iteration
from rl_core.paths import PROJECT_ROOT
from rl_core.store import Ref, Store

STAGES = ("generate", "execute_envs", "score_rewards", "train", "evaluate")


@dataclass
class StageResult:
    """What a stage body returns."""

    outputs: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)


@functools.cache
def code_version() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    from importlib.metadata import version

    return f"rlfoundry-{version('rlfoundry')}" + (f"+g{rev}" if rev else "")


def entry(ref: Ref, **extra: Any) -> dict[str, Any]:
    """A manifest entry for an artifact: uri, sha256 and optional extras (e.g. a folder's per-file hashes)."""
    return {**ref.to_dict(), **extra}


def ref_of(e: dict[str, Any]) -> Ref:
    return Ref(e["uri"], e["sha256"])


def _comparable(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: {"uri": v["uri"], "sha256": v["sha256"]} for k, v in inputs.items()}


def committed(store: Store, run_id: str, iteration: int, stage: str) -> dict[str, Any] | None:
    return store.read_manifest(store.stage_uri(run_id, iteration, stage))


def run_stage(
    store: Store,
    run_id: str,
    iteration: int,
    stage: str,
    config_hash: str,
    inputs: dict[str, dict[str, Any]],
    body: Callable[[str], StageResult],
) -> dict[str, Any]:
    """Run ``body(stage_uri)`` unless an identical committed run of this stage exists; return the manifest."""
    uri = store.stage_uri(run_id, iteration, stage)
    existing = store.read_manifest(uri)
    if (
        existing is not None
        and existing.get("config_hash") == config_hash
        and _comparable(existing.get("inputs", {})) == _comparable(inputs)
    ):
        existing["reused"] = True
        return existing
    store.clear(uri)
    set_iteration(iteration)
    fault(f"{stage}:start")
    t0 = time.perf_counter()
    started = time.time()
    result = body(uri)
    fault(f"{stage}:outputs")
    manifest = {
        "run_id": run_id,
        "iteration": iteration,
        "stage": stage,
        "status": "committed",
        "inputs": inputs,
        "outputs": result.outputs,
        "config_hash": config_hash,
        "code_version": code_version(),
        "seeds": result.seeds,
        "metrics": result.metrics,
        "timings": {"seconds": round(time.perf_counter() - t0, 4), "started_at": started},
    }
    store.write_manifest(uri, manifest)
    fault(f"{stage}:committed")
    manifest["reused"] = False
    return manifest
