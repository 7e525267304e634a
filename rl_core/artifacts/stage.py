"""The stage contract: run a stage once, commit it with a manifest, skip it when it is already committed.

A stage run is (run id, iteration, stage). ``run_stage`` looks for its manifest: when it exists and records
the same inputs and config hash, the stage is done and its manifest is returned as is. Anything else in the
folder is garbage from a crashed attempt and is cleared. The stage body gets one typed ``StageJob`` (its
iteration, its inputs, the folder to write into), writes its outputs (or returns the writes still to do:
``rl_core.artifacts.write_behind``) and returns their references; the manifest (inputs, outputs with sha256,
config hash, code version, seeds, timings, metrics) is written last, atomically. Which stages exist, what
each reads and writes: ``rl_core.pipeline.stages``.

    m = run_stage(store, "run1", 3, "generate", cfg_hash, {"policy": ckpt}, lambda job: body(ctx, job))
"""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Callable, Collection
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from rl_core.artifacts.faults import fault
from rl_core.artifacts.manifest import ArtifactRef, Manifest, Timings
from rl_core.artifacts.paths import PROJECT_ROOT
from rl_core.artifacts.store import ArtifactError, Store


@dataclass(frozen=True)
class StageJob:
    """Everything a stage body is given besides the run context: which iteration, the artifacts it reads (by
    the names of its table entry's inputs) and the folder its outputs go to."""

    iteration: int
    inputs: dict[str, ArtifactRef]
    out_uri: str


@dataclass
class StageResult:
    """What a stage body returns."""

    outputs: dict[str, ArtifactRef]
    metrics: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)
    # Writes of outputs not yet done (``Store.planned``: their references are in ``outputs``), done before
    # the commit: on the store's write-behind thread when it has one (``Store.write_behind``), else at once.
    pending: list[Callable[[], None]] = field(default_factory=list)


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


def committed(store: Store, run_id: str, iteration: int, stage: str) -> Manifest | None:
    return store.read_manifest(store.stage_uri(run_id, iteration, stage))


# Set by run_stage while it runs a body on a store that writes behind: the body may then leave the writes of
# its outputs to the commit (``pending_or_done``). A body called by itself (a replay, a benchmark's loop of
# bodies) writes them before it returns.
_DEFER: ContextVar[bool] = ContextVar("rlfoundry_defer_writes", default=False)


def pending_or_done(writes: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """``writes`` (``Store.planned``) for ``StageResult.pending`` when ``run_stage`` writes this stage behind
    the flow; else done now, and none left."""
    if _DEFER.get():
        return writes
    for write in writes:
        write()
    return []


def _reused(
    existing: Manifest, uri: str, config_hash: str, inputs: dict[str, ArtifactRef], accepted: Collection[str]
) -> Manifest:
    """The committed ``existing`` when it records these inputs under a known config, else the error."""
    known = existing.config_hash == config_hash or existing.config_hash in accepted
    if known and existing.same_inputs(inputs):
        return existing.model_copy(update={"reused": True})
    why = "other inputs than this run now gives it" if known else "a config this run does not record"
    raise ArtifactError(
        f"{uri} is committed with {why} (config hash {existing.config_hash[:12]}..., this run's "
        f"{config_hash[:12]}...); committed work is never deleted: resume with the run's recorded "
        "config, or start a new run"
    )


def run_stage(
    store: Store,
    run_id: str,
    iteration: int,
    stage: str,
    config_hash: str,
    inputs: dict[str, ArtifactRef],
    body: Callable[[StageJob], StageResult],
    accepted: Collection[str] = (),
    guard: Callable[[], None] | None = None,
) -> Manifest:
    """Run ``body`` unless this stage is committed with the same inputs, under ``config_hash`` or one of the
    ``accepted`` hashes (the run's earlier config versions); return the manifest. What an uncommitted
    attempt left in the stage's folder is cleared; a committed stage is never cleared: one that does not
    match (other inputs, a config the run never recorded) is an error naming it. ``guard`` is called right
    before the commit and may refuse it by raising (a lock this process must still hold)."""
    uri = store.stage_uri(run_id, iteration, stage)
    existing = store.read_manifest(uri)
    if existing is not None:
        return _reused(existing, uri, config_hash, inputs, accepted)
    store.clear(uri)
    fault(f"{stage}:start", iteration)
    t0, started, behind = time.perf_counter(), time.time(), store.write_behind
    token = _DEFER.set(behind)
    try:
        result = body(StageJob(iteration, inputs, uri))
    finally:
        _DEFER.reset(token)
    pending = result.pending
    if not behind:  # the writes are the stage's: in its seconds
        for write in pending:
            write()
    manifest = Manifest(
        run_id=run_id,
        iteration=iteration,
        stage=stage,
        inputs=inputs,
        outputs=result.outputs,
        config_hash=config_hash,
        code_version=code_version(),
        seeds=result.seeds,
        metrics=result.metrics,
        timings=Timings(seconds=round(time.perf_counter() - t0, 4), started_at=started),
    )

    def commit() -> None:
        for write in pending if behind else ():
            write()
        fault(f"{stage}:outputs", iteration)
        if guard is not None:
            guard()
        store.write_manifest(uri, manifest)
        fault(f"{stage}:committed", iteration)

    if behind and pending:  # its seconds are the flow's; every read of the stage waits for the commit
        store.behind.submit(uri, commit)
    else:
        commit()
    return manifest
