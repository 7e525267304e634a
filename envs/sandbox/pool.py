"""Many sandbox runs at once with bounded resources: a pool of small worker processes, each running one
sandbox at a time (so at most ``workers`` sandboxes exist, each within its own limits).

Workers are spawned fresh (not forked from the caller, which may hold a rollout engine and threads): each run
forks from a small process, which keeps the per-run fork cheap and safe.

    with SandboxPool(workers=4) as pool:
        results = pool.map([{"files": {"main.py": code}} for code in programs], Limits(timeout_s=5))
    # results[i] belongs to programs[i]
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from envs.sandbox.core import Limits, Mode, Sandbox, SandboxResult, check_available

_SANDBOX: Sandbox | None = None
log = logging.getLogger(__name__)


def exit_with_parent(on_exit: Any = None) -> None:
    """In a pool worker: exit as soon as the process that started it is gone (even if it was SIGKILLed), so no
    worker outlives a crashed run holding its pipes. Polls the parent pid from a daemon thread (unlike
    PR_SET_PDEATHSIG, this does not fire when merely the spawning *thread* ends)."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        if on_exit is not None:
            on_exit()
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _init(mode: Mode, reuse: bool = True) -> None:
    global _SANDBOX
    _SANDBOX = Sandbox(mode, dedicated=True, reuse=reuse)
    exit_with_parent(_SANDBOX.close)


def _one(job: Mapping[str, Any], limits: Limits) -> SandboxResult:
    assert _SANDBOX is not None
    return _SANDBOX.run(
        job["files"], job.get("argv"), stdin=job.get("stdin", b""), limits=job.get("limits", limits)
    )


def _worker_lost() -> SandboxResult:
    return SandboxResult(
        exit_code=None,
        timed_out=False,
        stdout="",
        stderr="sandbox: the pool's worker process died during this run, twice",
        stdout_truncated=False,
        stderr_truncated=False,
        stopped_reason="sandbox_error",
        duration_s=0.0,
    )


class SandboxPool:
    """``workers`` sandboxes at a time; ``map`` returns results in input order."""

    def __init__(self, workers: int | None = None, mode: Mode = "strict", *, reuse: bool = True):
        """``reuse`` (strict mode): each worker keeps one container and runs every job in it with namespaces,
        a /proc and a /work of its own (see ``envs/sandbox/zygote.py``); False: a new container per job."""
        check_available(mode)  # refuse here, in the caller, with the reason
        self.workers = workers or os.cpu_count() or 1
        self._args = (mode, reuse)
        self._ex = self._start()
        # Closed at exit before multiprocessing joins a process's children: a pool held by a pool worker (the
        # tool environment's py calls inside an env worker) would otherwise keep its parent from exiting.
        mp_util.Finalize(self, self.close, exitpriority=100)  # before the queues' own finalizers (10)

    def map(self, jobs: Iterable[Mapping[str, Any]], limits: Limits | None = None) -> list[SandboxResult]:
        """Run each job (``files``, optional ``argv``, ``stdin``, ``limits``); results in input order."""
        lim = limits or Limits()
        jobs = list(jobs)
        chunk = max(1, min(32, len(jobs) // (self.workers * 8) or 1))
        try:
            return list(self._ex.map(_one, jobs, [lim] * len(jobs), chunksize=chunk))
        except BrokenProcessPool:
            return self._map_after_a_death(jobs, lim)

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=self._args
        )

    def _restart(self) -> None:
        self._ex.shutdown(wait=True, cancel_futures=True)
        self._ex = self._start()

    def _map_after_a_death(self, jobs: list[Mapping[str, Any]], lim: Limits) -> list[SandboxResult]:
        """A worker process died during ``map`` (killed from outside, or a crash in the sandbox's own code,
        which no run should be able to cause): the pool starts afresh and every job runs again; a job whose
        worker dies again runs alone, so only a job that ends its worker by itself gets ``sandbox_error``.
        The results depend on the jobs only, never on which worker happened to die."""
        log.warning("a sandbox pool worker died; its %d jobs run again on fresh workers", len(jobs))
        self._restart()
        futures = [self._ex.submit(_one, job, lim) for job in jobs]
        out: list[SandboxResult | None] = [None] * len(jobs)
        for i, fut in enumerate(futures):
            with contextlib.suppress(BrokenProcessPool):
                out[i] = fut.result()
        broken = any(r is None for r in out)
        if len(jobs) > 1 and all(r is None for r in out):  # no worker lives to run any job: none's doing
            self._restart()
            raise RuntimeError("the sandbox pool's worker processes die before they run any job")
        for i in [i for i, r in enumerate(out) if r is None]:
            if broken:
                self._restart()
            try:
                out[i], broken = self._ex.submit(_one, jobs[i], lim).result(), False
            except BrokenProcessPool:
                out[i], broken = _worker_lost(), True
        if broken:
            self._restart()
        return [r for r in out if r is not None]

    def close(self) -> None:
        self._ex.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
