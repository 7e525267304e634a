"""Lineage writes in submission order, in the writer process, on the writer's thread or inline
(``tracking.writes``), and a failed write is not lost."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from rl_core.run.context import legacy_config_hash, run_config_hash
from rl_core.run.lineage import write_mode
from rl_core.run.lineage_writer import LineageWriter
from rl_core.schema.config import Config


def test_writes_run_in_order_and_flush_waits_only_for_what_is_due():
    w, seen, gate = LineageWriter(), [], threading.Event()
    w.submit(1, lambda: seen.append(1))
    w.submit(2, lambda: (gate.wait(10), seen.append(2)))
    w.flush(upto=1)  # does not wait for iteration 2's write, which is held back
    assert seen == [1]
    gate.set()
    w.flush()
    assert seen == [1, 2]


def test_a_failed_write_is_raised_at_the_next_flush():
    w = LineageWriter()

    def boom() -> None:
        raise ConnectionError("MLflow artifact upload for train: endpoint unreachable")

    w.submit(3, boom)
    w.flush(upto=2)  # not yet due
    with pytest.raises(ConnectionError, match="artifact upload for train"):
        w.flush(upto=3)
    w.flush()  # reported once, then gone


def test_inline_writes_run_in_the_submitting_thread_in_order_and_hold_their_failure():
    w, seen = LineageWriter("inline"), []
    w.submit(1, lambda: seen.append(threading.current_thread().name))

    def boom() -> None:
        raise ConnectionError("MLflow: database is locked")

    failed = w.submit(2, boom)
    w.submit(3, lambda: seen.append("after"))
    assert seen == [threading.current_thread().name, "after"]  # done at submit, by the caller
    assert isinstance(failed.exception(), ConnectionError)
    w.flush(upto=1)
    with pytest.raises(ConnectionError, match="database is locked"):
        w.flush(upto=2)  # raised where the thread's failure would be
    w.flush()


@pytest.mark.parametrize(
    ("given", "mode"),
    [
        # MLflow on SQLite under the state dir, the store a local folder: CPU work, in the writer process
        # from 8 iterations (its start is won back), inline for a shorter run
        ({}, "process"),
        ({"experiment": {"iterations": 8}}, "process"),
        ({"experiment": {"iterations": 7}}, "inline"),
        ({"tracking": {"mlflow_uri": "sqlite:////tmp/m.db"}, "store": {"uri": "/data/store"}}, "process"),
        ({"tracking": {"mlflow_uri": "file:///tmp/mlruns"}, "experiment": {"iterations": 2}}, "inline"),
        ({"tracking": {"writes": "process"}}, "process"),
        ({"tracking": {"mlflow_uri": "http://127.0.0.1:5000"}}, "background"),  # waits on a socket
        ({"tracking": {"mlflow_uri": "postgresql://mlflow@db/mlflow"}}, "background"),
        ({"store": {"uri": "s3://bucket/runs"}}, "background"),  # MLflow's artifacts go beside the store
        ({"store": {"uri": "s3://bucket/runs"}, "tracking": {"writes": "inline"}}, "inline"),
        ({"tracking": {"writes": "background"}}, "background"),
    ],
)
def test_where_the_writes_go(given: dict, mode: str) -> None:
    assert write_mode(Config.model_validate(given)) == mode


def _append(path: str, text: str) -> int:
    """A write the writer process runs: appends ``text`` to ``path``; its process id."""
    with open(path, "a") as f:
        f.write(text)
    return os.getpid()


def _fail(message: str) -> None:
    raise ConnectionError(message)


def test_the_writer_process_writes_in_order_outside_this_process_and_holds_its_failure(tmp_path: Path):
    w, log = LineageWriter("process"), str(tmp_path / "log")
    pids = [w.submit(k, functools.partial(_append, log, str(k))) for k in range(1, 6)]
    w.submit(6, functools.partial(_fail, "MLflow: database is locked"))
    w.flush(upto=5)
    assert Path(log).read_text() == "12345"  # one process, in submission order
    assert {f.result() for f in pids} != {os.getpid()} and len({f.result() for f in pids}) == 1
    with pytest.raises(ConnectionError, match="database is locked"):
        w.close()  # the failure of iteration 6, at the last flush
    w.submit(7, functools.partial(_append, log, "7"))  # a later write starts a new process
    w.close()
    assert Path(log).read_text() == "123457"
    with pytest.raises(ValueError, match="unknown lineage write mode 'procces'"):
        LineageWriter("procces")


def test_the_write_mode_is_not_part_of_the_runs_hash() -> None:
    """How lineage is written changes no stage's output: a run resumes with another mode."""
    a, b = Config(), Config.model_validate({"tracking": {"writes": "background"}})
    assert run_config_hash(a) == run_config_hash(b)
    assert legacy_config_hash(a) == legacy_config_hash(b)


@pytest.mark.parametrize("mode", ["process", "background"])
def test_a_batch_goes_as_one_job_when_its_block_ends(tmp_path: Path, mode: str):
    w, log = LineageWriter(mode), str(tmp_path / "log")
    with w.batch():
        first = w.submit(1, functools.partial(_append, log, "a"))
        failed = w.submit(1, functools.partial(_fail, "MLflow: database is locked"))
        last = w.submit(1, functools.partial(_append, log, "b"))
        assert not first.done() and not Path(log).exists()  # held until the block ends
    assert first.result(timeout=60) == last.result(timeout=60)  # one job: the same process or thread
    assert Path(log).read_text() == "ab"  # in order; a failed write does not stop the ones after it
    assert isinstance(failed.exception(), ConnectionError)
    with pytest.raises(ConnectionError, match="database is locked"):
        w.close()


def test_a_flush_inside_a_batch_sends_it_first(tmp_path: Path):
    """An alarm that stops the run inside the iteration's batch: the flow flushes before the block ends."""
    w, log = LineageWriter("process"), str(tmp_path / "log")
    with w.batch():
        w.submit(1, functools.partial(_append, log, "a"))
        w.flush()  # would wait forever for a write that is never sent
        assert Path(log).read_text() == "a"
        w.submit(2, functools.partial(_append, log, "b"))  # the batch has ended: sent at once
    w.close()
    assert Path(log).read_text() == "ab"


def _die(code: int) -> None:
    os._exit(code)


def test_the_writer_process_takes_no_thread_of_the_flows_and_its_death_fails_what_is_out(tmp_path: Path):
    """Jobs go down a pipe from the submitting thread (no executor threads taking the interpreter lock from
    the stages); a writer that dies fails every write still out, naming its exit code."""
    import threading

    w, log = LineageWriter("process"), str(tmp_path / "log")
    before = threading.active_count()
    first = w.submit(1, functools.partial(_append, log, "a"))
    with w.batch():
        w.submit(2, functools.partial(_append, log, "b"))
    assert threading.active_count() == before
    assert first.result(timeout=60) != os.getpid()
    w.submit(3, functools.partial(_die, 3))
    lost = w.submit(4, functools.partial(_append, log, "c"))
    with pytest.raises(RuntimeError, match=r"lineage writer process exited \(code 3\)"):
        w.flush()
    assert isinstance(lost.exception(), RuntimeError)
    assert Path(log).read_text() == "ab"
    w.close()


def _no_start(warm: tuple[Any, ...]) -> None:
    pass


def test_a_wait_on_a_killed_writer_fails_naming_it_instead_of_hanging():
    """SIGKILLed from outside (the OOM killer): a wait for any of its futures, even one no job was sent for,
    ends with the process's failure; a later submit fails the same way."""
    from rl_core.run.writer_process import WriterProcess

    proc = WriterProcess((), _no_start)
    assert proc.submit(os.getpid).result(timeout=60) != os.getpid()
    proc._proc.kill()
    with pytest.raises(RuntimeError, match=r"exited \(code -9\)"):
        proc.future().result(timeout=30)
    with pytest.raises(RuntimeError, match=r"exited \(code -9\)"):
        proc.submit(os.getpid).result(timeout=30)
    proc.shutdown()


def test_shutdown_ends_the_writer_even_while_another_process_holds_its_pipe_open():
    """A process forked from the flow's (a worker) inherits the job pipe: shutdown does not wait for the
    pipe's end, it tells the writer to stop, and the writer exits by itself (code 0, not killed after the
    join's timeout). A result that cannot come back is named instead."""
    import subprocess
    import threading
    import time

    from rl_core.run.writer_process import WriterProcess

    proc = WriterProcess((), _no_start)
    assert proc.submit(os.getpid).result(timeout=60) != os.getpid()
    with pytest.raises(RuntimeError, match="unpicklable outcome"):  # (a lock) named, the writer still up
        proc.submit(threading.Lock).result(timeout=60)
    holder = subprocess.Popen(["sleep", "60"], pass_fds=(proc._jobs.fileno(),))
    try:
        t0 = time.monotonic()
        proc.shutdown()
        assert time.monotonic() - t0 < 10 and proc._proc.exitcode == 0
    finally:
        holder.kill()
        holder.wait()


def _writer_state() -> tuple[bool, int]:
    import sys

    from rl_core.run.lineage_jobs import _lineage

    return "torch" in sys.modules, _lineage.cache_info().currsize


def test_the_runs_writer_process_starts_ready_without_the_stages(tmp_path: Path):
    """``start`` spawns the run's writer process before any write; it opens the run's MLflow lineage at its
    start (not in the first write, at its low priority), and imports neither torch nor the stages (seconds
    of CPU beside the engines' start)."""
    from rl_core.schema.config import load_config
    from tasks.common import lineage_writer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("configs/smoke.yaml", [f"tracking.mlflow_uri={uri}", "tracking.writes=process"])
    w = lineage_writer(cfg)
    w.start()
    assert w._pool is not None  # spawned before any write
    assert w.submit(1, _writer_state).result(timeout=120) == (False, 1)
    w.close()
