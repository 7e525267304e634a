"""The ``Sandbox`` facade: picks the run mode and checks, once, that every mechanism it needs is here.

Three modes of ``Sandbox.run``: a one-off run in a fresh container with a cgroup of its own
(``fresh.py``); in a dedicated process, a fresh container born in the process's own cgroup (``fresh.py``,
``reuse=False``); in a dedicated strict process with ``reuse=True`` (the pool's default), a run in the
process's long-lived container, with namespaces, /proc and /work of its own (``container.py``, ``zygote.py``).

Covers: refusing to run (``SandboxUnavailable``, naming what is missing and what to do) when bubblewrap, the
system Python, libseccomp, user namespaces or (strict mode) cgroups are unusable; reaping bubblewrap's briefly
orphaned processes in dedicated processes (child subreaper), so no zombie is charged to a slot uid. What each
mechanism covers is stated in its own module; the package docstring sums it up.

    sb = Sandbox(); sb.run({"main.py": "print(6 * 7)"}).stdout  # "42\\n"
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from envs.sandbox import cgroup
from envs.sandbox.bwrap import PYTHON, bwrap_command, check_name, memfd
from envs.sandbox.cgroup import Cgroup, sweep_dead_workers
from envs.sandbox.container import Container
from envs.sandbox.fresh import run_fresh
from envs.sandbox.limits import WEAKER_MODE_HINT, Limits, Mode, SandboxUnavailable, configured_mode
from envs.sandbox.output import OUTPUT_KILL_FACTOR, SandboxResult
from envs.sandbox.seccomp import run_filter, supervisor_filter
from envs.sandbox.slots import SLOTS, UID_BASE, slot_processes

__all__ = [
    "OUTPUT_KILL_FACTOR",
    "PYTHON",
    "SLOTS",
    "UID_BASE",
    "Limits",
    "Mode",
    "Sandbox",
    "SandboxResult",
    "SandboxUnavailable",
    "check_available",
    "configured_mode",
    "slot_processes",
]
_PR_SET_CHILD_SUBREAPER = 36


class Sandbox:
    """Runs untrusted programs: a fresh container per ``run``, or (``dedicated`` and ``reuse``, strict mode)
    a fresh set of namespaces per run inside one long-lived container.

    ``dedicated=True`` (a process that only runs sandboxes: the pool's workers, ``rlfoundry sandbox exec``):
    the process becomes a child subreaper and reaps every orphan after each run (bubblewrap's pid-1 process
    outlives its parent for a moment, and a host init that does not reap would keep it as a zombie, charged to
    the slot uid's process limit), and it keeps one cgroup for what it starts: its reused container, joined
    once when the container starts (or each fresh container, joined as it starts). The process itself stays
    outside that cgroup, so a run that fills it (memory held in files, which no process's size shows) can
    only bring the kernel's OOM killer onto the cgroup's own processes, never onto this one. Before each run
    the cgroup's limits are set to the run's (memory: the container's own usage + ``memory_mb``), after it
    every process in it but the container's is killed. Otherwise each run gets a cgroup of its own; use the
    pool from long-lived processes.
    """

    def __init__(self, mode: Mode = "strict", *, dedicated: bool = False, reuse: bool = False):
        check_available(mode)
        self.mode = mode
        self.dedicated = dedicated
        self.reuse = reuse and dedicated and mode == "strict"
        self._box: Container | None = None
        self._own: Cgroup | None = None
        if dedicated:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if dedicated and mode == "strict":
            sweep_dead_workers()
            self._own = Cgroup(f"worker-{os.getpid()}-{secrets.token_hex(4)}", 64, 1 << 40)
            atexit.register(self.close)

    def close(self) -> None:
        """Leave and remove the worker cgroup (pool workers, at exit)."""
        if self._box is not None:
            self._box.close()
            self._box = None
        if self._own is not None:
            self._own.kill_all()
            self._own.remove()
            self._own = None

    def run(
        self,
        files: Mapping[str, str | bytes],
        argv: list[str] | None = None,
        *,
        stdin: bytes = b"",
        limits: Limits | None = None,
    ) -> SandboxResult:
        """Run ``argv`` (default ``python3 main.py``) in /work holding ``files``."""
        lim = limits or Limits()
        argv = argv or [PYTHON, "-E", "-s", "main.py"]
        named = {check_name(n): (c.encode() if isinstance(c, str) else c) for n, c in files.items()}
        total = sum(len(c) for c in named.values())
        if total > lim.disk_mb * 1024 * 1024:
            raise ValueError(f"sandbox files total {total} bytes, more than disk_mb={lim.disk_mb}")
        try:
            if self.reuse and self._own is not None:
                return self._run_reused(named, argv, stdin, lim)
            return run_fresh(named, argv, stdin, lim, self.mode, self._own)
        finally:
            if self.dedicated:
                _reap()

    def _run_reused(
        self, named: dict[str, bytes], argv: list[str], stdin: bytes, lim: Limits
    ) -> SandboxResult:
        assert self._own is not None
        try:
            for _ in range(2):  # a container that could not set the run up is replaced once
                if self._box is not None and not self._box.alive:
                    self._box.close()
                    self._box = None
                if self._box is None:
                    self._box = Container(self._own)
                res = self._box.run(named, argv, stdin, lim)
                if res is not None:
                    return res
            raise SandboxUnavailable("the sandbox's supervisor could not set up a run in a fresh container")
        finally:
            if self._box is not None and not self._box.alive:
                self._box.close()
                self._box = None


def _reap() -> None:
    """Collect every exited child (orphans included, as a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@functools.cache
def check_available(mode: Mode = "strict") -> None:
    """Raise SandboxUnavailable naming the missing mechanism, or return when ``mode`` can run here."""
    if mode not in ("strict", "rlimits"):
        raise SandboxUnavailable(f"unknown sandbox mode {mode!r}: strict or rlimits")
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: apt-get install bubblewrap (make test does)"
        )
    if not Path(PYTHON).exists():
        raise SandboxUnavailable(
            f"{PYTHON} is missing: the sandbox runs the system's Python (apt-get install python3)"
        )
    run_filter()
    supervisor_filter()
    if mode == "strict":
        _check_cgroups()
    _check_namespaces()


def _check_cgroups() -> None:
    try:
        Cgroup(f"probe-{os.getpid()}-{secrets.token_hex(3)}", 4, 64 << 20).remove()
    except OSError as e:
        raise SandboxUnavailable(
            f"cannot create a per-run cgroup under {cgroup.CG_ROOT} ({e}); without it memory and process "
            "limits are rlimits only. To accept that weaker isolation, use the rlimits mode: "
            f"{WEAKER_MODE_HINT}."
        ) from e


def _as_first_slot() -> None:
    os.setgroups([])
    os.setresgid(UID_BASE, UID_BASE, UID_BASE)
    os.setresuid(UID_BASE, UID_BASE, UID_BASE)


def _check_namespaces() -> None:
    sfd = memfd("seccomp", run_filter())
    try:
        r = subprocess.run(
            bwrap_command({}, ["/usr/bin/true"], 1, sfd),
            pass_fds=[sfd],
            env={},
            capture_output=True,
            timeout=30,
            preexec_fn=_as_first_slot if os.geteuid() == 0 else None,
        )
    finally:
        os.close(sfd)
    if r.returncode != 0:
        raise SandboxUnavailable(
            "bubblewrap cannot create its namespaces here (user namespaces disabled, or a container whose "
            f"seccomp profile forbids them): {r.stderr.decode(errors='replace').strip()}. The sandbox "
            "refuses to run code without them; in Kubernetes give the pod a seccomp profile allowing user "
            "namespaces, or a gVisor/Kata runtime class."
        )
