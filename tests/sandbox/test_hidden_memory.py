"""Memory that no process's size shows (memfds written with write/pwrite, detached SysV shared memory): it
is charged to the run's cgroup, so a run that fills the cgroup with it brings the kernel's OOM killer onto
the cgroup's largest process. The process that starts the sandbox is never in that cgroup: the run is
stopped for ``memory``, the pool's worker lives on and its next run works. (Before, the worker shared the
cgroup and was the one killed: the pool broke and every later ``map`` raised.)"""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time

import pytest

from envs.sandbox import Limits
from envs.sandbox.pool import SandboxPool
from tests.sandbox.conftest import sandbox_exec

LIMITS = Limits(timeout_s=10, memory_mb=128)

ATTACKS = {
    "memfd_write": """
        import os
        fds = [os.memfd_create("x") for _ in range(64)]
        for fd in fds:
            for _ in range(16):
                os.write(fd, b"\\1" * (1 << 20))
        print("not stopped")
    """,
    "memfd_pwrite": """
        import os
        for i in range(64):
            fd = os.memfd_create("y")
            for k in range(16):
                os.pwrite(fd, b"\\2" * (1 << 20), k << 20)
        print("not stopped")
    """,
    "sysv_shm_detached": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        for _ in range(64):
            sid = libc.shmget(0, 16 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if sid < 0:
                raise SystemExit(f"shmget: {ctypes.get_errno()}")
            addr = libc.shmat(sid, None, 0)
            ctypes.memset(addr, 3, 16 << 20)
            libc.shmdt(ctypes.c_void_p(addr))  # gone from this process's size, still charged
        print("not stopped")
    """,
}


def _workers(pool: SandboxPool) -> set[int]:
    return set(pool._ex._processes)  # the executor's worker pids (stdlib)


@pytest.mark.parametrize("reuse", [True, False], ids=["reused_container", "fresh_container"])
def test_hidden_memory_stops_the_run_not_the_worker(reuse):
    with SandboxPool(1, reuse=reuse) as pool:
        assert pool.map([{"files": {"main.py": "print(1)"}}], LIMITS)[0].stdout == "1\n"
        workers = _workers(pool)
        for name, code in ATTACKS.items():
            r = pool.map([{"files": {"main.py": textwrap.dedent(code)}}], LIMITS)[0]
            assert r.stopped_reason == "memory" and r.exit_code != 0, (name, r)
            assert "not stopped" not in r.stdout, name
            after = pool.map([{"files": {"main.py": "print(2)"}}], LIMITS)[0]
            assert (after.stdout, after.stopped_reason) == ("2\n", None), (name, after)
            assert _workers(pool) == workers, f"{name}: the worker was replaced"


def test_cli_sandbox_exec_reports_the_memory_stop(tmp_path):
    """``rlfoundry sandbox exec`` runs in a dedicated process: the OOM killer must not take that process."""
    prog = tmp_path / "p.py"
    prog.write_text(textwrap.dedent(ATTACKS["memfd_write"]))
    r = sandbox_exec(prog, "--memory-mb", "128")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["stopped_reason"] == "memory" and "not stopped" not in out["stdout"], out


def test_a_worker_killed_from_outside_costs_no_result():
    """A worker that dies mid-``map`` (here SIGKILLed from outside; no run can do it) breaks the executor:
    the jobs run again on fresh workers, so every job still gets its own result, in order."""
    progs = [f"import time; time.sleep({0.6 if i % 2 else 0.05}); print({i})" for i in range(6)]
    with SandboxPool(2) as pool:
        pool.map([{"files": {"main.py": "print(0)"}}] * 2, LIMITS)  # both workers up

        def kill_one() -> None:
            time.sleep(0.3)
            subprocess.run(["kill", "-9", str(min(_workers(pool)))], check=True)

        killer = threading.Thread(target=kill_one)
        killer.start()
        results = pool.map([{"files": {"main.py": p}} for p in progs], LIMITS)
        killer.join()
        assert [(r.stdout, r.stopped_reason) for r in results] == [(f"{i}\n", None) for i in range(6)]
        assert pool.map([{"files": {"main.py": "print(7)"}}], LIMITS)[0].stdout == "7\n"
