"""infra.localstack.process, the one way servers are started and stopped, on plain processes (no server): a
reused pid is never signalled, stop reaches the whole process group and SIGKILLs what ignores SIGTERM, and a
process tied to its parent dies when the parent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from infra.localstack.process import Server, spawn

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_reused_pid_is_left_alone():
    other = subprocess.Popen(["sleep", "60"])
    try:
        created = psutil.Process(other.pid).create_time()
        stale = Server("old server", other.pid, created - 100.0, Path("/nonexistent.log"))
        assert not stale.alive()
        assert stale.stop(timeout_s=1) is False
        stale.kill()
        assert other.poll() is None
        assert Server.from_record(stale.record()) == stale
        # its grace travels with its record (a later `rlfoundry down` waits what its starter chose), and a
        # record written before the field existed gets the default
        quick = Server.from_record({**stale.record(), "stop_grace_s": 3.0})
        assert quick.stop_grace_s == 3.0 and Server.from_record(quick.record()).stop_grace_s == 3.0
        old = {k: v for k, v in stale.record().items() if k != "stop_grace_s"}
        assert Server.from_record(old).stop_grace_s == 6.0
    finally:
        other.kill()
        other.wait()


def test_stop_sigkills_the_group_when_sigterm_is_ignored(tmp_path):
    prog = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)"
    )
    log = tmp_path / "logs" / "server.log"
    srv = spawn("stubborn", [sys.executable, "-c", prog], env=dict(os.environ), log=log)
    deadline = time.monotonic() + 10
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    assert srv.alive() and psutil.pid_exists(child)
    t0 = time.monotonic()
    assert srv.stop(timeout_s=1) is True
    assert time.monotonic() - t0 < 8
    assert not srv.alive() and _gone(child, 2)
    assert srv.stop() is False  # already stopped


def test_a_tied_process_dies_with_its_parent_killed_by_sigkill(tmp_path):
    """As a SIGKILLed `rlfoundry run` and its private Prefect server: the parent cannot clean up, the tether
    stops the server."""
    parent_prog = (
        "import sys, time; from pathlib import Path; from infra.localstack.process import spawn; "
        f"s = spawn('sleeper', ['sleep', '600'], env={{}}, log=Path({str(tmp_path / 'server.log')!r}), "
        "tie_to_parent=True); print(s.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_prog], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        tether = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 10
        while not tether.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (server,) = tether.children()
        assert server.name() == "sleep"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone(server.pid) and _gone(tether.pid)
    finally:
        parent.kill()
        parent.wait()
