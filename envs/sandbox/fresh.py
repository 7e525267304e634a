"""One run in a fresh container: the mode of ``Sandbox.run`` outside a reused pool worker.

Covers: every run gets a bubblewrap container of its own (``bwrap.py``: all namespaces new, so no kernel state
of an earlier run is reachable), run with the run's seccomp filter (``seccomp.py``), its slot uid
(``slots.py``), pid 1 of its pid namespace ``init.py`` (non-dumpable, holds none of the run's stdio: the
program cannot read its stdin back, forge its output or status, or outlive it), rlimits set by util-linux
``prlimit`` before bubblewrap starts (address space = ``memory_mb``,
CPU seconds, file size = ``disk_mb``, 256 open files, ``max_procs`` processes, no core dumps), a cgroup
(``cgroup.py``: a new one per run, or the dedicated worker's, its limits set to the run's; the run joins it
as it starts, and the process that starts it is never in it), and the wall-clock timeout, after which the
process group and every process in the cgroup are killed.

Does not cover: without a cgroup (mode "rlimits") memory and process limits are rlimits only, which count per
process, not per run, and do not count memory held in files (memfds, SysV shared memory, pipe buffers).

    result = run_fresh(named_files, argv, stdin, limits, mode="strict", worker_cgroup=None)
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from envs.sandbox.bwrap import PYTHON, bwrap_command, memfd
from envs.sandbox.cgroup import Cgroup, joiner
from envs.sandbox.limits import Limits, Mode
from envs.sandbox.output import Output, SandboxResult, verdict
from envs.sandbox.seccomp import run_filter
from envs.sandbox.slots import Slot

# pid 1 of every fresh container: non-dumpable, holds none of the run's stdio (its docstring says why)
INIT = Path(__file__).with_name("init.py")


@functools.cache
def _init_code() -> bytes:
    """``init.py``'s bytes, read once per process (a pool worker runs thousands of fresh containers)."""
    return INIT.read_bytes()


def run_fresh(
    named: dict[str, bytes],
    argv: list[str],
    stdin: bytes,
    lim: Limits,
    mode: Mode,
    worker_cgroup: Cgroup | None,
) -> SandboxResult:
    """Run ``argv`` in a new container holding ``named`` in /work; ``worker_cgroup``: a dedicated worker's
    cgroup for its runs (the run joins it), else strict mode makes one for this run."""
    slot = Slot()
    fds: list[int] = []
    cg = worker_cgroup
    try:
        file_fds = {n: memfd(n, c) for n, c in named.items()}
        fds += file_fds.values()
        sfd, in_fd = memfd("seccomp", run_filter()), memfd("stdin", stdin)
        fds += [sfd, in_fd]
        if cg is not None:
            cg.set_limits(lim.max_procs + 2, cg.memory_usage() + (lim.memory_mb << 20))
        elif mode == "strict":
            cg = Cgroup(f"run-{slot.index}-{secrets.token_hex(4)}", lim.max_procs + 2, lim.memory_mb << 20)
        join = cg.join_fds() if cg is not None else []
        fds += join
        ooms = cg.oom_kills() if cg else 0
        init = memfd("init", _init_code())
        fds.append(init)
        inner = [PYTHON, "-I", "-S", "-B", "/.sandbox/init.py", *argv]
        box = bwrap_command(file_fds, inner, lim.disk_mb, sfd, {"/.sandbox/init.py": init}, as_pid_1=True)
        cmd = _prlimit(lim) + box
        child = joiner(join) if join else None
        return _execute(cmd, in_fd, [*file_fds.values(), sfd, init], child, slot, lim, cg, ooms)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if cg is not None:
            cg.kill_all()
            if cg is not worker_cgroup:
                cg.remove()
        slot.release()


def _prlimit(lim: Limits) -> list[str]:
    """rlimits through util-linux prlimit, so the child needs no Python between fork and exec."""
    cpu = lim.cpu_seconds
    return [
        "prlimit",
        f"--as={lim.memory_mb << 20}",
        f"--cpu={cpu}:{cpu + 1}",
        f"--fsize={lim.disk_mb << 20}",
        "--nofile=256",
        f"--nproc={lim.max_procs + 2}",
        "--core=0",
        "--",
    ]


def _execute(
    cmd: list[str],
    stdin_fd: int,
    pass_fds: list[int],
    child: Callable[[], None] | None,
    slot: Slot,
    lim: Limits,
    cg: Cgroup | None,
    ooms_before: int,
) -> SandboxResult:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=stdin_fd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        env={},
        start_new_session=True,
        preexec_fn=child,
        close_fds=True,
        **slot.popen_ids(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = Output(proc.stdout.fileno(), proc.stderr.fileno(), lim)
    reason = out.drain(t0 + lim.timeout_s)
    if reason is None:
        try:
            proc.wait(timeout=max(0.0, t0 + lim.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            reason = "timeout"
    if reason is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if cg is not None:
            cg.kill_all()
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return verdict(proc.returncode, reason, out, lim, cg, ooms_before, t0)
