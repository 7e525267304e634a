"""The store lock of a shared base-model stage (rl_core.artifacts.store_lock) on a local store: runs racing
for one stage build it once, a killed holder's lock is taken over (at once on this host, after the stale time
from another host), a live holder on another host is waited for, and a holder that lost its lock commits
nothing. The same on S3 (SeaweedFS): tests/integration/test_s3_store.py; two real runs, one killed
mid-warm-up:
tests/integration/test_shared_base.py."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rl_core.artifacts.stage import StageResult, committed
from rl_core.artifacts.store import Store
from rl_core.artifacts.store_lock import LockLost, StageLock, run_shared_stage

PREFIX = "_base/0123456789abcdef"
NO_SUCH_PID = 4_194_304 + 17  # above Linux's largest pid_max: never a running process


def _store(tmp_path) -> Store:
    return Store(str(tmp_path / "store"))


def race(store: Store, runs: int, seconds: float = 0.3, **lock) -> tuple[list, list]:
    """``runs`` threads build the same stage at once; the body sleeps ``seconds`` so that they overlap."""
    built: list[str] = []
    results: list = [None] * runs

    def body(job):
        built.append(job.out_uri)
        time.sleep(seconds)
        return StageResult(outputs={"w": store.write_bytes(f"{job.out_uri}/w.bin", b"weights")})

    def one(i: int) -> None:
        results[i] = run_shared_stage(store, PREFIX, 0, "warmup", "h", {}, body, holder=f"run{i}", **lock)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return built, results


def _plant(store: Store, holder: dict, beat: bytes | None = b"1") -> str:
    """A lock left by someone else (and, optionally, its heartbeat)."""
    uri = store.stage_uri(PREFIX, 0, "warmup") + ".lock"
    assert store.create_exclusive(uri, json.dumps(holder).encode())
    if beat is not None:
        store.write_bytes(f"{uri}-{holder['token']}.beat", beat)
    return uri


def test_runs_started_together_build_the_stage_once(tmp_path):
    store = _store(tmp_path)
    built, results = race(store, 4)
    assert len(built) == 1  # one body ran; the other three waited and reused its commit
    assert sum(not m.reused for m in results) == 1 and sum(m.reused for m in results) == 3
    assert len({m.outputs["w"].sha256 for m in results}) == 1
    leftovers = [p.name for p in (tmp_path / "store" / PREFIX / "iter-0000").iterdir()]
    assert leftovers == ["warmup"]  # no lock, heartbeat or marker left behind


def test_a_lock_whose_process_is_gone_is_taken_over_at_once(tmp_path):
    import socket

    store = _store(tmp_path)
    stage = store.stage_uri(PREFIX, 0, "warmup")
    store.write_bytes(f"{stage}/half-written.bin", b"partial")  # what the killed holder left
    token = "dead0000dead0000"
    _plant(store, {"token": token, "owner": "killed", "host": socket.gethostname(), "pid": NO_SUCH_PID})
    t0 = time.monotonic()
    built, (m,) = race(store, 1, stale_after_s=30, heartbeat_s=1)
    assert time.monotonic() - t0 < 10  # not the 30 s stale rule: the holder's pid is not running here
    assert len(built) == 1 and not m.reused
    assert not store.exists(f"{stage}/half-written.bin")  # the killed attempt's leftovers were cleared
    assert not store.exists(f"{stage}.lock-{token}.beat")


def test_a_silent_lock_from_another_host_is_taken_only_after_the_stale_time(tmp_path):
    store = _store(tmp_path)
    _plant(store, {"token": "aaaa", "owner": "elsewhere", "host": "another-pod", "pid": 1})
    t0 = time.monotonic()
    built, (m,) = race(store, 1, stale_after_s=1.5, heartbeat_s=0.2)
    waited = time.monotonic() - t0
    assert 1.5 <= waited < 10, waited  # another host's pid says nothing: its heartbeat decides
    assert len(built) == 1 and committed(store, PREFIX, 0, "warmup") is not None


def test_a_live_holder_on_another_host_is_waited_for_not_broken(tmp_path):
    store = _store(tmp_path)
    holder = {"token": "bbbb", "owner": "busy", "host": "another-pod", "pid": 1}
    uri = _plant(store, holder)
    stop = threading.Event()

    def beating() -> None:  # the other host's holder: beats every 0.2 s for 2.5 s, then releases
        n, t0 = 1, time.monotonic()
        while time.monotonic() - t0 < 2.5:
            n += 1
            store.write_bytes(f"{uri}-bbbb.beat", str(n).encode())
            time.sleep(0.2)
        store.remove(uri)
        stop.set()

    other = threading.Thread(target=beating)
    other.start()
    t0 = time.monotonic()
    built, (m,) = race(store, 1, stale_after_s=1.0, heartbeat_s=0.2)
    other.join()
    assert time.monotonic() - t0 >= 2.4  # waited out the live holder although 1 s < 2.5 s
    assert stop.is_set() and len(built) == 1


def test_a_holder_that_lost_its_lock_commits_nothing(tmp_path):
    store = _store(tmp_path)
    stage = store.stage_uri(PREFIX, 0, "warmup")

    def body(job):
        store.remove(f"{stage}.lock")  # broken by another run while this one was building
        _plant(store, {"token": "cccc", "owner": "thief", "host": "another-pod", "pid": 1})
        return StageResult(outputs={"w": store.write_bytes(f"{job.out_uri}/w.bin", b"w")})

    with pytest.raises(LockLost, match="lost the lock .*warmup.lock"):
        run_shared_stage(
            store, PREFIX, 0, "warmup", "h", {}, body, holder="slow", heartbeat_s=0.1, stale_after_s=1
        )
    assert committed(store, PREFIX, 0, "warmup") is None
    assert json.loads(store.read_bytes(f"{stage}.lock"))["token"] == "cccc"  # the new holder's lock kept


def test_lock_settings_are_checked(tmp_path):
    from rl_core.schema.config import ConfigError, load_config

    with pytest.raises(ValueError, match="at most a third"):
        StageLock(_store(tmp_path), "file:///x/iter-0000/warmup", owner="r", stale_after_s=2, heartbeat_s=1)
    with pytest.raises(ConfigError, match="store.lock_heartbeat_s"):
        load_config(None, ["store.lock_heartbeat_s=30", "store.lock_stale_after_s=60"])


def test_create_exclusive_never_overwrites(tmp_path):
    store = _store(tmp_path)
    uri = f"{store.root}/a/b.lock"
    assert store.create_exclusive(uri, b"first") is True
    assert store.create_exclusive(uri, b"second") is False
    assert store.read_bytes(uri) == b"first"
    store.remove(uri)
    store.remove(uri)  # already gone: nothing to do
    assert store.read_bytes_if_any(uri) is None
