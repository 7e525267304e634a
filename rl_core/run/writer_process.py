"""The lineage writer's process: jobs go to it down one pipe, their results come back up another, and no
thread of the flow's process takes part.

A ``ProcessPoolExecutor`` hands each job to two threads of its own (its manager thread pickles it, a queue's
feeder thread writes it), and each takes the interpreter lock from the stages while they run. Here ``submit``
pickles the job and writes it to the pipe in the calling thread (well under a millisecond an iteration:
``benchmarks/lineage_writes.py``'s ``handoff_ms``); results are read when someone waits for one
(``Drained``'s ``result``/``exception``, or ``drain``), and in passing at each ``submit`` (so the result pipe
never fills).

    proc = WriterProcess(warm=("mlflow",), start=start_writer)
    fut = proc.submit(functools.partial(write, ...))   # a Drained future
    fut.result()                                       # reads results until this one's is in
    proc.shutdown()
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NoReturn

POLL_S = 0.2  # how often a wait checks that the process still lives


def serve(jobs: Any, results: Any, warm: tuple[Any, ...], start: Callable[[tuple[Any, ...]], None]) -> None:
    """In the writer process: ``start(warm)``, then each job in the order sent, its (id, succeeded, result or
    exception) sent back, until told to stop (None) or the job pipe ends."""
    start(warm)
    while True:
        try:
            job = jobs.recv()
        except EOFError:  # the flow is gone
            return
        if job is None:  # shutdown (not the pipe's end: a process forked from the flow's may hold it open)
            _exit_now()
        seq, fn, args = job
        try:
            out: tuple[int, bool, Any] = (seq, True, fn(*args))
        except Exception as exc:  # held for that job's future
            out = (seq, False, exc)
        try:
            results.send(out)
        except OSError:  # the flow is gone
            return
        except Exception as exc:  # a result or exception that does not pickle: say what it was
            results.send((seq, False, RuntimeError(f"lineage write {seq}: unpicklable outcome ({exc})")))


def _exit_now() -> NoReturn:
    """End the writer once told to: every job is done and its result sent, so nothing is left for the
    interpreter's teardown but ~0.7 s of freeing MLflow's and Prefect's modules (measured here), which the
    flow's end would wait for. Log handlers are flushed first."""
    import logging
    import os

    logging.shutdown()
    os._exit(0)


class Drained(Future):
    """A future settled by reading the writer's results: waiting on it reads them until it is settled."""

    def __init__(self, drain: Callable[[Future[Any], float | None], None]) -> None:
        super().__init__()
        self._drain = drain

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():  # (a settled one is read in its own done-callbacks, inside a drain)
            self._drain(self, timeout)
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done():
            self._drain(self, timeout)
        return super().exception(timeout=0)


class WriterProcess:
    """One spawned process running jobs (picklable callables) in the order they were submitted."""

    def __init__(self, warm: tuple[Any, ...], start: Callable[[tuple[Any, ...]], None]) -> None:
        ctx = mp.get_context("spawn")
        jobs_out, self._jobs = ctx.Pipe(duplex=False)
        self._results, results_in = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=serve, args=(jobs_out, results_in, warm, start), name="rlf-lineage-writer", daemon=True
        )
        self._proc.start()
        jobs_out.close()
        results_in.close()
        self._seq = itertools.count(1)
        self._waiting: dict[int, Drained] = {}
        self._send_lock = threading.Lock()  # stages of two iterations may submit at once (asynchronous RL)
        self._read_lock = threading.Lock()
        self._dead: BaseException | None = None

    def future(self) -> Drained:
        """A future of this writer's (settled as its results are read)."""
        return Drained(self.drain)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Drained:
        fut = self.future()
        if self._read_lock.acquire(blocking=False):  # results already in, so their pipe never fills (not
            try:  # when another thread is reading them: it is)
                self._take_ready()
            finally:
                self._read_lock.release()
        with self._send_lock:
            if self._dead is not None:
                fut.set_exception(self._dead)
                return fut
            seq = next(self._seq)
            self._waiting[seq] = fut
            with contextlib.suppress(OSError):  # the process is gone: the wait names it
                self._jobs.send((seq, fn, args))
        return fut

    def drain(self, until: Future[Any] | None, timeout: float | None) -> None:
        """Read results until ``until`` is settled (None: those already in, without waiting; ``timeout``
        seconds at most, then TimeoutError); if the process has died, every job still out fails naming it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._read_lock:
            if until is None:
                self._take_ready()
                return
            while not until.done():
                left = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
                if self._results.poll(left):
                    if self._read():
                        continue
                elif self._proc.is_alive():
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(f"lineage writer: no result in {timeout} s")
                    continue
                self._fail_all()  # the pipe's end, or the process gone: nothing more will come
                if not until.done():  # (a future of no job sent)
                    until.set_exception(self._dead)  # type: ignore[arg-type]
                return

    def _take_ready(self) -> None:
        """Settle the results already in, without waiting (the read lock held)."""
        while self._results.poll(0):
            if not self._read():
                self._fail_all()
                return

    def _read(self) -> bool:
        """Settle the next result's future; False at the pipe's end."""
        try:
            seq, ok, value = self._results.recv()
        except (EOFError, OSError):
            return False
        self._settle(seq, ok, value)
        return True

    def _settle(self, seq: int, ok: bool, value: Any) -> None:
        with self._send_lock:
            fut = self._waiting.pop(seq)
        fut.set_result(value) if ok else fut.set_exception(value)

    def _fail_all(self) -> None:
        with contextlib.suppress(OSError):
            while self._results.poll(0) and self._read():  # what it sent before it died
                pass
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        with self._send_lock:
            self._dead = self._dead or RuntimeError(
                f"the lineage writer process exited (code {code}) with {len(self._waiting)} write(s) not "
                "done; what the run committed is written again when it resumes"
            )
            waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            fut.set_exception(self._dead)

    def shutdown(self, wait: bool = True) -> None:
        """Tell the process to end after the jobs sent, close the job pipe; ``wait``: until it has ended."""
        if wait:
            for fut in list(self._waiting.values()):
                fut.exception()
        with self._send_lock:
            with contextlib.suppress(OSError):
                self._jobs.send(None)
            self._jobs.close()
        if wait:
            self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._results.close()
