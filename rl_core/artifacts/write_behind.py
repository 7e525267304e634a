"""Write-behind commits: a stage's large outputs written while the flow goes on, its manifest committed after.

The train stage's checkpoint and optimizer state are written at every step; the next stage that needs them
is the next generate, which samples from the weights the train engine handed it in memory. So a stage body
run by ``run_stage`` on a store that writes behind returns its writes instead of doing them
(``StageResult.pending``, ``pending_or_done``: called by itself, as a replay does, it does them), with the
references (digests) they will have computed already; ``run_stage`` then hands them and the manifest's
commit to this writer, one thread per store, in the order they were handed over, and returns the manifest.

Nothing reads a stage's outputs before its commit: a read of its manifest, of a file under its folder, or
of its folder (``Store.read_manifest``, ``read_bytes``, ``local_dir``, ``clear``) waits for the commit
first (``settle``). A commit that failed (a full disk, an unreachable S3) fails that read, naming the stage
and why; the stage was not committed, so a resume runs it again. A kill before the commit leaves the stage
uncommitted, exactly as a kill during a synchronous write does: a resume re-runs it from its committed
inputs, bit for bit. The hashing stays in the stage (the manifest needs the digests); what moves is the I/O.
Measured (``benchmarks/write_behind.py``): on S3, where the upload waits on the network, the step is shorter;
on a local folder it is not (the writes are CPU copies into the page cache, and the thread gets the
interpreter lock back only when the flow's thread gives it up), so ``store.write_behind: auto`` writes behind
on a remote store only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class WriteBehindError(RuntimeError):
    """A commit written behind the flow failed: its stage is not committed."""


class WriteBehind:
    """The commits one store writes behind its flow, by stage folder URI."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, Future[None]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, stage_uri: str, commit: Callable[[], None]) -> None:
        """Run ``commit`` (the stage's writes, then its manifest) on the writer thread, after those before."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="write-behind")
            self._pending[stage_uri] = self._pool.submit(commit)

    def pending(self) -> list[str]:
        """The stage folders whose commits are still being written."""
        with self._lock:
            return [u for u, f in self._pending.items() if not f.done()]

    def settle(self, uri: str | None = None) -> None:
        """Wait for the commits of ``uri``'s stage folder (``uri`` is it or lies under it; a URI under none
        waits for nothing), or for all of them when None; a failed one raises WriteBehindError naming it."""
        with self._lock:
            if not self._pending:
                return
            mine = [
                (u, f)
                for u, f in self._pending.items()
                if uri is None or uri == u or uri.startswith(u + "/") or u.startswith(uri + "/")
            ]
        for u, fut in mine:
            try:
                fut.result()
            except BaseException as e:
                raise WriteBehindError(
                    f"{u}: its outputs or manifest could not be written ({type(e).__name__}: {e}); the stage "
                    "is not committed (a resume runs it again)"
                ) from e
            finally:
                with self._lock:
                    if self._pending.get(u) is fut:
                        del self._pending[u]

    def __reduce__(self) -> tuple[Any, ...]:
        # A store handed to another process has nothing still writing behind: what it reads is committed.
        self.settle()
        return (WriteBehind, ())
