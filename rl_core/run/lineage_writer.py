"""The lineage writer: MLflow and Prefect records of a run written in order, tagged by iteration, where
``tracking.writes`` says (``rl_core.run.lineage.write_mode``): in a writer process, on a thread, or inline.

    w = LineageWriter("process")
    with w.batch():                          # one job for the writes of the block
        w.submit(3, functools.partial(write_iteration_records, ...))
    w.flush(upto=3)                          # wait for iteration <= 3's writes; raise the first failure
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def _run_all(writes: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """A batch's writes in order, where the writer runs them: each one's (succeeded, result or exception)."""
    out: list[tuple[bool, Any]] = []
    for write in writes:
        try:
            out.append((True, write()))
        except Exception as exc:  # held for that write's future
            out.append((False, exc))
    return out


def _settle(futures: list[Future[Any]], job: Future[Any]) -> None:
    """Each write's future from its batch's job (the job's own failure: every write's)."""
    try:
        results = job.result()
    except BaseException as exc:  # the writer process died: every write of the batch failed with it
        results = [(False, exc)] * len(futures)
    for fut, (ok, value) in zip(futures, results, strict=True):
        fut.set_result(value) if ok else fut.set_exception(value)


# The writer process's CPU priority once started: beside the stages' threads at the same priority it cost more
# than the writes themselves; at 19 it takes the cores the stages leave (benchmarks/lineage_writes.py). A
# machine saturated by other work starves it, and the flow waits on its flush: set ``tracking.writes: inline``
# there.
WRITER_NICE = 19


def _start_writer(warm: tuple[Any, ...]) -> None:
    """In the writer process: import and open what its writes need (``warm``: module names and picklable
    callables, in order, at normal priority: seconds of CPU it spends once, not behind every stage), then
    lower its priority (``WRITER_NICE``), and exit as soon as the flow's process is gone (even SIGKILLed), as
    the environment pool's workers do."""
    import importlib

    from envs.sandbox.pool import exit_with_parent

    for item in warm:
        importlib.import_module(item) if isinstance(item, str) else item()
    os.nice(WRITER_NICE)
    exit_with_parent()


class LineageWriter:
    """Lineage writes in order, tagged by iteration: on one background thread, in one writer process
    (``process``: each write a picklable callable), or ``inline`` (each when submitted, in the submitting
    thread; a failure is still held for ``flush``). Stage records are held back per MLflow run (``defer``)
    until the run is closed (``take``: its records, written in one batch).

    >>> w = LineageWriter()
    >>> seen = []
    >>> first = w.submit(1, lambda: seen.append("a")); second = w.submit(2, lambda: seen.append("b"))
    >>> w.flush(upto=1); seen[:1]
    ['a']
    >>> w.flush(); seen
    ['a', 'b']
    """

    def __init__(self, mode: str = "background", warm: tuple[Any, ...] = ()) -> None:
        if mode not in ("background", "inline", "process"):
            raise ValueError(f"tracking.writes: unknown lineage write mode {mode!r}")
        self.mode, self.warm = mode, warm  # warm: what the writer process imports or calls at its start
        self._pool: Any = None
        self._pending: list[tuple[int, Future[Any]]] = []
        self._lock = threading.Lock()  # stages of two iterations may submit at once (asynchronous RL)
        self._deferred: dict[str, list[Any]] = {}
        self._batch: list[tuple[int, Callable[[], Any], Future[Any]]] | None = None
        self._batch_thread = 0

    @property
    def inline(self) -> bool:
        return self.mode == "inline"

    def start(self) -> None:
        """Start the writer process now (``process``; else nothing): its imports (``warm``) then take the core
        the run's own start leaves, before the first write waits on them."""
        if self.mode == "process":
            self._executor()

    def _executor(self) -> Any:
        if self._pool is None:  # (again after close: a flow run after another in one process)
            if self.mode == "process":
                from rl_core.run.writer_process import WriterProcess

                self._pool = WriterProcess(self.warm, _start_writer)
            else:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlf-lineage")
        return self._pool

    def _future(self) -> Future[Any]:
        """A write's future: in the writer process's mode one that reads the process's results when waited
        on (``rl_core.run.writer_process.Drained``)."""
        return self._executor().future() if self.mode == "process" else Future()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Writes the calling thread submits inside the block go to the thread or process as one job, when
        the block ends (each its own future): one pipe write for the writer process, one hand-over for the
        thread (which takes the interpreter lock from the stages each time)."""
        if self.inline or self._batch is not None:
            yield
            return
        self._batch, self._batch_thread = [], threading.get_ident()
        try:
            yield
        finally:
            self._dispatch()

    def _dispatch(self) -> None:
        """The open batch's writes, as one job now (the batch ends: later writes go one by one)."""
        with self._lock:
            items, self._batch = self._batch, None
        if items:
            job = self._executor().submit(_run_all, [write for _, write, _ in items])
            job.add_done_callback(functools.partial(_settle, [fut for _, _, fut in items]))

    def defer(self, run: str, record: Any) -> None:
        """Hold ``record`` (a stage's manifest) for MLflow run ``run`` until ``take``."""
        with self._lock:
            self._deferred.setdefault(run, []).append(record)

    def take(self, run: str) -> list[Any]:
        """The records held for ``run``, in the order they came (and forget them)."""
        with self._lock:
            return self._deferred.pop(run, [])

    def submit(self, iteration: int, write: Callable[[], Any]) -> Future[Any]:
        """Queue ``write`` (tagged with ``iteration``), or run it now when inline; its future (``flush`` also
        waits for it and raises its failure)."""
        if self.inline:
            fut: Future[Any] = Future()
            try:
                fut.set_result(write())
            except Exception as exc:  # held, as the thread would hold it, for flush or result()
                fut.set_exception(exc)
            with self._lock:
                self._pending.append((iteration, fut))
            return fut
        with self._lock:
            if self._batch is not None and threading.get_ident() == self._batch_thread:
                fut = self._future()
                self._batch.append((iteration, write, fut))
            else:
                fut = self._executor().submit(write)
            self._pending.append((iteration, fut))
        return fut

    def flush(self, upto: int | None = None) -> None:
        """Wait for the writes of iterations <= ``upto`` (all when None); raise the first one's failure. A
        batch open in this thread is sent first (its writes would otherwise never come)."""
        if self._batch is not None and threading.get_ident() == self._batch_thread:
            self._dispatch()
        with self._lock:
            due = [(k, f) for k, f in self._pending if upto is None or k <= upto]
            self._pending = [(k, f) for k, f in self._pending if not (upto is None or k <= upto)]
        for _, fut in due:
            fut.result()

    def close(self) -> None:
        """Flush, then end the thread or process (a later write starts a new one)."""
        try:
            self.flush()
        finally:
            with self._lock:
                pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True)
