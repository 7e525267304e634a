"""The typed records of the stage contract: an artifact reference and a stage's manifest.

A manifest (``<stage folder>/_manifest.json``, written last: the commit marker) lists every input and output
as an ``ArtifactRef``, the config hash, the code version, the seeds, timings and metrics. The JSON on disk is
``Manifest.model_dump(mode="json")``; reading validates it, so a hand-edited or truncated manifest is reported
as corrupt instead of failing later with a KeyError.

    m = store.read_manifest(store.stage_uri(run_id, 3, "train"))
    m.outputs["checkpoint"].files["model.safetensors"]     # the policy's sha256
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

_DIGEST = re.compile(r"[0-9a-f]{64}")


class ArtifactRef(BaseModel):
    """A stored artifact: where it is and what its bytes hash to; for a table its row count, for a folder
    (a checkpoint) the sha256 of each file, ``sha256`` being their ``dir_digest``. The one reference type of
    manifests, stage inputs and the store's API.

    A hand-edited reference cannot name a place outside the store or a cache: ``sha256`` (a cache folder's
    name) must be 64 lowercase hex digits and every ``files`` key a relative path with no ``..``.

    >>> ArtifactRef(uri="s3://b/r/iter-0001/generate/rollouts.parquet", sha256="ab" * 32, rows=3).rows
    3
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str
    sha256: str
    rows: int | None = None
    files: dict[str, str] | None = None
    # False: not written to the store (a checkpoint or optimizer state between ``train.checkpoint_every``
    # points). The run holds it in memory and rebuilds it by re-running the train stages since the last
    # written checkpoint. A checkpoint's ``sha256`` and ``files`` are still those of the folder it would have
    # been; an optimizer state's ``sha256`` is derived from its checkpoint's (it names the state; nothing
    # hashes its bytes).
    stored: bool | None = None

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not _DIGEST.fullmatch(value):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, not {value[:80]!r}")
        return value

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, str] | None) -> dict[str, str] | None:
        for rel, digest in (files or {}).items():
            parts = rel.split("/")
            if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"files: {rel[:200]!r} is not a path inside the folder")
            if not _DIGEST.fullmatch(digest):
                raise ValueError(f"files: the sha256 of {rel!r} must be 64 lowercase hex digits")
        return files

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def same_artifact(self, other: ArtifactRef) -> bool:
        """Same place, same bytes (what makes a committed stage's input still valid)."""
        return (self.uri, self.sha256) == (other.uri, other.sha256)


class Timings(BaseModel):
    model_config = ConfigDict(extra="allow")

    seconds: float
    started_at: float


class Manifest(BaseModel):
    """One committed stage run: (run id, iteration, stage) with its inputs, outputs and record."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    iteration: int
    stage: str
    status: str = "committed"
    inputs: dict[str, ArtifactRef]
    outputs: dict[str, ArtifactRef]
    config_hash: str
    code_version: str
    seeds: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    timings: Timings
    reused: bool = Field(False, exclude=True, description="Found committed in the store, not run now.")

    def same_inputs(self, inputs: dict[str, ArtifactRef]) -> bool:
        """Whether this manifest was committed from exactly these inputs (names, places and bytes)."""
        return set(self.inputs) == set(inputs) and all(
            self.inputs[k].same_artifact(v) for k, v in inputs.items()
        )
