"""One process at a time runs a run (rl_core.run.run_lock): a second ``run``/``resume`` of a running run is
refused naming the holder (it cleared the stage folder the first was committing into: a committed manifest
over an emptied folder, a run that could never be resumed); a holder that died is noticed and its lock
broken; a holder whose lock was broken commits nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_core.artifacts.store import Store
from rl_core.artifacts.store_lock import LockLost
from rl_core.run.run_lock import RunBusy, holding_run, run_guard


def _ctx(root: Path, run_id: str = "r1") -> SimpleNamespace:
    sc = SimpleNamespace(lock_stale_after_s=6.0, lock_heartbeat_s=1.0)
    return SimpleNamespace(store=Store(str(root)), run_id=run_id, cfg=SimpleNamespace(store=sc))


def _hold(root: str, ready: mp.Event) -> None:  # another process running the run
    with holding_run(_ctx(Path(root))):
        ready.set()
        time.sleep(600)


@pytest.fixture
def holder(tmp_path):
    spawn = mp.get_context("spawn")
    ready = spawn.Event()
    proc = spawn.Process(target=_hold, args=(str(tmp_path), ready), daemon=True)
    proc.start()
    assert ready.wait(60), "the holding process did not start"
    yield proc
    if proc.is_alive():
        proc.kill()
    proc.join()


def test_a_second_process_is_refused_then_takes_over_from_a_dead_one(tmp_path, holder):
    busy = f"run r1 is running in another process: .*pid {holder.pid}"
    with pytest.raises(RunBusy, match=busy), holding_run(_ctx(tmp_path)):
        pass
    os.kill(holder.pid, signal.SIGKILL)  # crashed: its lock stays in the store
    holder.join()
    assert (tmp_path / "r1" / "run.lock").exists()
    with holding_run(_ctx(tmp_path)) as lock:  # on this host a dead pid is seen at once
        assert run_guard(_ctx(tmp_path)) == lock.check
        lock.check()


def test_a_run_held_here_is_re_entered_and_guards_its_commits(tmp_path):
    ctx = _ctx(tmp_path)
    assert run_guard(ctx) is None  # not held: a replayed stage, a tool
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "run.json").write_text("{}")
    with holding_run(ctx) as lock, holding_run(ctx) as again:  # the command, then its flow
        assert again is lock
        guard = run_guard(ctx)
        guard()
        (tmp_path / "r1" / "run.lock").unlink()  # broken by another after this one's heartbeat starved
        with pytest.raises(LockLost, match="nothing committed by this run"):
            guard()
    assert run_guard(ctx) is None and not (tmp_path / "r1" / "run.lock").exists()


def test_a_run_refused_before_its_record_leaves_no_folder(tmp_path):
    with pytest.raises(ValueError, match="refused"), holding_run(_ctx(tmp_path)):
        raise ValueError("refused by the preflight")
    assert list(tmp_path.iterdir()) == []
