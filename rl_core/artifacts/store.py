"""Artifact store over fsspec: ``file://`` (or a plain path) by default, ``s3://bucket/prefix`` at scale.

On s3:// every call is retried with exponential backoff while the endpoint is unreachable (connection refused,
timeouts, 5xx); then a ``StoreUnavailable`` names the endpoint (rl_core.artifacts.retries). Nothing is
committed by a failed call.

A stage run owns ``<root>/<run id>/iter-<KKKK>/<stage>/``; its ``_manifest.json``, written last, atomically,
commits it. Every artifact's sha256 is verified on read: a corrupt one is named by path, never consumed. A
local file whose stats are those of a verified read before (rl_core.artifacts.memo) is not read again.

    store = Store("file:///tmp/rl")
    ref = store.write_table(store.stage_uri("run1", 3, "generate") + "/rollouts.parquet", df)
    df = store.read_table(ref)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import fsspec
import pandas as pd

from rl_core.artifacts.faults import fault, iteration_of
from rl_core.artifacts.manifest import ArtifactRef, Manifest
from rl_core.artifacts.memo import Memo, Seen, file_stats, settled
from rl_core.artifacts.page_cache import WrittenPages
from rl_core.artifacts.retries import with_retries
from rl_core.artifacts.write_behind import WriteBehind

MANIFEST = "_manifest.json"
Write = Callable[[], None]  # a planned write (``Store.planned``), done before its stage commits
T = TypeVar("T")


def _json_object(raw: bytes) -> dict[str, Any]:
    """A JSON document that must be an object (a manifest); ValueError for anything else."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__}")
    return data


class ArtifactError(RuntimeError):
    """An artifact is missing, corrupt or unreadable; the message names its URI."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_digest(file_hashes: dict[str, str]) -> str:
    """One hash for a folder: sha256 over its sorted (relative name, file sha256) pairs."""
    return sha256_bytes(json.dumps(sorted(file_hashes.items())).encode())


_PARSED_MAX_BYTES = 32 << 20  # larger tables are parsed at every read (not held in memory)


class Store:
    """Read and write artifacts under one root URI."""

    def __init__(self, root: str, *, retries: int = 6, retry_max_wait_s: float = 20.0):
        if "://" not in root:
            root = "file://" + str(Path(root).resolve())
        self.root = root.rstrip("/")
        self.protocol = root.split("://", 1)[0]
        self.retries, self.retry_max_wait_s = retries, retry_max_wait_s
        self.parsed = Memo(16)  # the stages of an iteration read its rollouts five times
        self.verified = Memo(64)  # local folders (checkpoints) by path and digest: their files' stats
        self.seen = Seen(256)  # local manifests and tables read before, while unchanged on disk
        self.behind = WriteBehind()  # stages whose outputs and manifest are still being written (run_stage)
        self.write_behind = False  # whether run_stage may commit a stage's pending writes behind the flow
        self.pages = WrittenPages()  # large local files written: their pages handed back once on disk
        options: dict[str, Any] = {}
        if self.protocol == "s3":
            # One attempt per call inside botocore/s3fs: the backoff is ours, so it is bounded and reported.
            options = {
                "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 1}}
            }
        self.fs, _ = fsspec.core.url_to_fs(self.root, **options)
        # a local root as the OS resolves it (the root may itself be a link): no path may resolve outside it
        self.real_root = os.path.realpath(self.fs._strip_protocol(self.root)) if self.is_local else ""

    def _io(self, what: str, fn: Callable[[], T]) -> T:
        if self.is_local:
            return fn()
        return with_retries(fn, what=what, attempts=self.retries, max_wait_s=self.retry_max_wait_s)

    # -- naming -------------------------------------------------------------------------------------
    def run_uri(self, run_id: str) -> str:
        """``<root>/<run_id>``. Users' ids are checked by ``rl_core.run.runs.check_run_id`` where they enter;
        the store's own prefixes (``_base/<hash>``, ``<run>/sweep``) have several segments, and no segment may
        climb out of the root."""
        parts = run_id.split("/")
        if any(p in ("", ".", "..") or "\\" in p for p in parts):
            raise ArtifactError(f"run prefix {run_id!r} would leave the store {self.root}")
        return f"{self.root}/{run_id}"

    def stage_uri(self, run_id: str, iteration: int, stage: str) -> str:
        return f"{self.run_uri(run_id)}/iter-{iteration:04d}/{stage}"

    def _path(self, uri: str) -> str:
        """The filesystem path of ``uri``, which must be the root or under it: every read, write and removal
        goes through here, so neither a caller's URI nor one read from a (possibly tampered) manifest can
        reach a file outside the store (``file:///etc/...``, another bucket, ``<root>/../x``, a symbolic link
        in a local store to a file outside it)."""
        if uri != self.root:
            rest = uri[len(self.root) + 1 :] if uri.startswith(self.root + "/") else None
            if rest is None or any(p in (".", "..") or "\\" in p for p in rest.split("/")):
                raise ArtifactError(f"{uri} is outside the store {self.root}: refused")
        path = self.fs._strip_protocol(uri)
        if self.is_local:  # nor may a symbolic link in the store lead a read or write out of it
            real = os.path.realpath(path)
            if real != self.real_root and not real.startswith(self.real_root.rstrip(os.sep) + os.sep):
                raise ArtifactError(f"{uri} leads outside the store {self.root} (to {real}, a link): refused")
        return path

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    # -- bytes ----------------------------------------------------------------------------------
    def exists(self, uri: str) -> bool:
        return self._io(f"stat {uri}", lambda: self.fs.exists(self._path(uri)))

    def write_bytes(self, uri: str, data: bytes) -> ArtifactRef:
        self.put_bytes(uri, data)
        return ArtifactRef(uri=uri, sha256=sha256_bytes(data))

    def planned(self, uri: str, data: bytes) -> tuple[ArtifactRef, Write]:
        """The reference ``data`` will have at ``uri``, and the write that puts it there."""
        return ArtifactRef(uri=uri, sha256=sha256_bytes(data)), functools.partial(self.put_bytes, uri, data)

    def put_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` at ``uri`` (whole or not at all, as a reader sees it)."""
        path = self._path(uri)
        if self.is_local:
            # Write-then-rename so that a reader never sees a half-written file.
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                half = memoryview(data)  # slices of a view: no copy of the bytes
                f.write(half[: len(data) // 2])
                f.flush()
                fault("write", iteration_of(uri))
                f.write(half[len(data) // 2 :])
            os.replace(tmp, path)
            self.pages.wrote(path, len(data))
        else:
            self._io(f"write {uri}", lambda: self.fs.pipe_file(path, data))  # a single S3 PUT is atomic

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Write ``uri`` only if nothing is there (True), else leave it alone (False): a conditional create
        (``If-None-Match: *`` on S3; a hard link of a written file on a local or NFS folder, so a reader never
        sees it half-written). What locks (``rl_core.artifacts.store_lock``) are built on."""
        path = self._path(uri)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)

        def put() -> bool:
            try:
                self.fs.pipe_file(path, data, mode="create")
                return True
            except OSError as e:  # 412 Precondition Failed: the object exists (s3fs reports it as EINVAL)
                self.fs.invalidate_cache(path)
                if "pre-condition" in str(e).lower() or "precondition" in str(e).lower():
                    return False
                raise

        return self._io(f"create {uri}", put)

    def remove(self, uri: str) -> None:
        """Delete one object (nothing when it is already gone)."""
        path = self._path(uri)

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
            if not self.is_local:
                self.fs.invalidate_cache(path)

        self._io(f"remove {uri}", rm)

    def read_bytes_if_any(self, uri: str) -> bytes | None:
        """The bytes at ``uri``, or None when nothing is there (no listing cache involved)."""
        path = self._path(uri)

        def cat() -> bytes | None:
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None

        return self._io(f"read {uri}", cat)

    def read_bytes(self, ref: ArtifactRef | str) -> bytes:
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        self.behind.settle(uri)
        try:
            data = self._io(f"read {uri}", lambda: self.fs.cat_file(self._path(uri)))
        except FileNotFoundError as e:
            raise ArtifactError(f"artifact missing: {uri}") from e
        if isinstance(ref, ArtifactRef) and sha256_bytes(data) != ref.sha256:
            raise ArtifactError(
                f"artifact corrupt: {uri} has sha256 {sha256_bytes(data)[:16]}..., "
                f"manifest says {ref.sha256[:16]}..."
            )
        return data

    def write_json(self, uri: str, obj: Any) -> ArtifactRef:
        return self.write_bytes(uri, json.dumps(obj, indent=2, sort_keys=True).encode())

    def read_json(self, ref: ArtifactRef | str) -> Any:
        """The JSON document; one that does not parse is an ``ArtifactError`` naming it."""
        try:
            return json.loads(self.read_bytes(ref))
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, past the digit or nesting limits
            raise ArtifactError(f"corrupt JSON: {getattr(ref, 'uri', ref)}: {str(e)[:300]}") from e

    # -- tables ---------------------------------------------------------------------------------
    def write_table(self, uri: str, df: pd.DataFrame) -> ArtifactRef:
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        return self.write_bytes(uri, buf.getvalue()).model_copy(update={"rows": len(df)})

    def read_table(self, ref: ArtifactRef | str) -> pd.DataFrame:
        """The table, verified against its digest; one whose verified bytes were parsed before (the stages
        of an iteration read its rollouts five times) comes from the parse cache (``self.parsed``), as a copy.
        A local file is read and hashed again unless its stats are those it was verified with (``seen``)."""
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        digest = ref.sha256 if isinstance(ref, ArtifactRef) else ""
        self.behind.settle(uri)
        path, began = self._path(uri) if digest and self.is_local else "", time.time_ns()
        stats = self.seen.stats(path) if path else None
        if stats and self.seen.get(path, stats) == digest and (df := self.parsed.get(digest)) is not None:
            return df.copy()
        data = self.read_bytes(ref)
        if stats:
            self.seen.put(path, stats, began, digest)
        if digest and (df := self.parsed.get(digest)) is not None:
            return df.copy()
        try:
            df = pd.read_parquet(io.BytesIO(data))
        except Exception as e:
            raise ArtifactError(f"artifact unreadable as parquet: {uri}: {e}") from e
        if digest and len(data) <= _PARSED_MAX_BYTES:
            self.parsed.put(digest, df.copy())
        return df

    # -- folders (checkpoints) ----------------------------------------------------------------------
    def put_files(self, files: dict[str, bytes], uri: str) -> ArtifactRef:
        """Write a folder of ``files`` (relative name -> bytes); its reference, as ``put_dir`` gives it."""
        ref, writes = self.planned_files(files, uri)
        for write in writes:
            write()
        return ref

    def planned_files(self, files: dict[str, bytes], uri: str) -> tuple[ArtifactRef, list[Write]]:
        """``planned`` for a folder of ``files``: its reference, and its files' writes in name order."""
        planned = {rel: self.planned(f"{uri}/{rel}", data) for rel, data in sorted(files.items())}
        hashes = {rel: ref.sha256 for rel, (ref, _) in planned.items()}
        return ArtifactRef(uri=uri, sha256=dir_digest(hashes), files=hashes), [w for _, w in planned.values()]

    def put_dir(self, local_dir: str | Path, uri: str) -> ArtifactRef:
        """Upload a local folder; returns its reference (folder digest and per-file hashes)."""
        local_dir = Path(local_dir)
        hashes: dict[str, str] = {}
        for p in sorted(local_dir.rglob("*")):
            if p.is_file():
                rel = p.relative_to(local_dir).as_posix()
                data = p.read_bytes()
                hashes[rel] = self.write_bytes(f"{uri}/{rel}", data).sha256
        return ArtifactRef(uri=uri, sha256=dir_digest(hashes), files=hashes)

    def local_dir(self, ref: ArtifactRef, cache_root: Path) -> Path:
        """A verified local copy of a stored folder (the folder itself when the store is local)."""
        if ref.files is None:
            raise ArtifactError(f"artifact {ref.uri} is not a folder (its reference lists no files)")
        self.behind.settle(ref.uri)
        files = ref.files
        if self.is_local:  # hashed again only when a file changed since (the stages read each several times)
            path, began = Path(self._path(ref.uri)), time.time_ns()
            key, stats = f"{path}\0{ref.sha256}", file_stats(path, sorted(files))
            if stats is None or self.verified.get(key) != stats:
                self._verify_dir(ref, files, path)
                if stats is not None and settled(stats, began):
                    self.verified.put(key, stats)
            return path
        if dir_digest(files) != ref.sha256:  # the cache folder is named by it: it must be these files'
            raise ArtifactError(f"artifact corrupt: {ref.uri}: its files' hashes do not give its sha256")
        dest = cache_root / ref.sha256
        if not (dest / ".complete").exists():
            tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".dl-"))
            for rel, sha in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(self.read_bytes(ArtifactRef(uri=f"{ref.uri}/{rel}", sha256=sha)))
            (tmp / ".complete").touch()
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        return dest

    def _verify_dir(self, ref: ArtifactRef, files: dict[str, str], path: Path) -> None:
        actual = {}
        for rel in files:
            f = path / rel
            if not f.exists():
                raise ArtifactError(f"artifact missing: {ref.uri}/{rel}")
            actual[rel] = sha256_file(f)
            if actual[rel] != files[rel]:
                raise ArtifactError(f"artifact corrupt: {ref.uri}/{rel} does not match its manifest sha256")
        if dir_digest(actual) != ref.sha256:
            raise ArtifactError(f"artifact corrupt: {ref.uri} folder digest does not match its manifest")

    # -- manifests --------------------------------------------------------------------------------
    def write_manifest(self, stage_uri: str, manifest: Manifest) -> ArtifactRef:
        return self.write_json(f"{stage_uri}/{MANIFEST}", manifest.model_dump(mode="json"))

    def read_manifest(self, stage_uri: str) -> Manifest | None:
        uri = f"{stage_uri}/{MANIFEST}"
        self.behind.settle(uri)
        try:  # a local one unchanged since it was read is not read again (``self.seen``)
            if self.is_local:
                data = self.seen.read(self._path(uri), lambda: _json_object(self.read_bytes(uri)))
            else:
                data = _json_object(self.read_bytes(uri)) if self.exists(uri) else None
            return None if data is None else Manifest.model_validate(data)
        # a manifest that does not parse, is not an object ("null" read as "none yet" would let the stage be
        # cleared and run again over what was committed), nests or counts past Python's limits
        except (ValueError, RecursionError) as e:  # JSON's, Unicode's and pydantic's errors among them
            raise ArtifactError(f"manifest corrupt: {uri}: {str(e)[:300]}") from e

    def list_runs(self) -> list[str]:
        base = self._path(self.root)
        if not self.exists(self.root):
            return []
        names = self._io(f"list {self.root}", lambda: self.fs.ls(base, detail=False, refresh=True))
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in names)

    def remove_if_empty(self, uri: str) -> None:
        """Remove the folder ``uri`` if nothing is in it (a local store's; an object store has no folders)."""
        if self.is_local:
            with contextlib.suppress(OSError):
                os.rmdir(self._path(uri))

    def clear(self, uri: str) -> None:
        """Remove a stage folder's leftovers from a crashed attempt."""
        self.behind.settle(uri)
        path = self._path(uri)
        if self.exists(uri):
            self._io(f"remove {uri}", lambda: self.fs.rm(path, recursive=True))
