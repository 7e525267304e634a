"""The reused container of a dedicated pool worker (``Sandbox(dedicated=True, reuse=True)``) and its client.

One bubblewrap container (``bwrap.py``: the same namespaces, read-only root, slot uid and cgroup as a one-off
run) runs the supervisor ``zygote.py`` under ``seccomp.supervisor_filter()``; this class sends it one request
per run over a Unix socket and turns its answer into a ``SandboxResult``. It saves the container set-up
(~5 ms of a ~17 ms run).

Covers, between runs of one container: each run gets new user, mount, pid, IPC, UTS and network namespaces, a
fresh /proc and a fresh tmpfs /work from the supervisor (see ``zygote.py``), and ``seccomp.run_filter()``
before its code starts. So a run cannot read what an earlier run left in SysV IPC (shared memory, semaphores,
message queues), POSIX message queues, the hostname, abstract Unix sockets or other network state, the pid
counter, or /work (files, inode numbers, the directory's mode, times and xattrs); ``test_sandbox_reuse.py``
attacks each. Within a run: the container's cgroup (the worker process is not in it) is set to the run's
limits (pids, memory: the container's own usage + ``memory_mb``), the program has hard rlimits, and after it
exits (or at its timeout) every process in the cgroup but the container's own is killed. The supervisor is in
none of the run's namespaces but the user namespace's parent and is not dumpable; a run that kills its pid-1
or ends abnormally cannot damage the container, and if the supervisor stops answering or cannot set a run up,
the container is replaced. A run that fills the cgroup with memory no process's size shows (memfds, SysV
shared memory) may bring the OOM killer onto the supervisor: the run is then stopped for ``memory``.

Does not cover: state the kernel shares across all namespaces (see the package docstring: host-wide counters
and timing side channels), and the worker's cgroup statistics, which only the worker reads.

    box = Container(worker_cgroup); result = box.run(named_files, argv, stdin, limits)  # None: replace box
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

from envs.sandbox.bwrap import PYTHON, bwrap_command, memfd
from envs.sandbox.cgroup import Cgroup, joiner
from envs.sandbox.limits import Limits, SandboxUnavailable
from envs.sandbox.output import Output, SandboxResult, verdict
from envs.sandbox.seccomp import run_filter, supervisor_filter
from envs.sandbox.slots import Slot

# The processes of a run besides the program and its children: the supervisor's setup fork and the run's init.
_RUN_OVERHEAD = 2


class Container:
    """A long-lived container running ``zygote.py``; ``alive`` turns False when it must be replaced."""

    def __init__(self, cg: Cgroup):
        self.cg = cg
        self.slot = Slot()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zfd = memfd("zygote", (Path(__file__).parent / "zygote.py").read_bytes())
        rfd, sfd = memfd("run.bpf", run_filter()), memfd("seccomp", supervisor_filter())
        argv = [PYTHON, "-I", "/.sandbox/zygote.py", str(theirs.fileno())]
        system = {"/.sandbox/zygote.py": zfd, "/.sandbox/run.bpf": rfd}
        join = cg.join_fds()  # the container joins the cgroup as it starts; the worker stays outside it
        try:
            self.proc = subprocess.Popen(
                bwrap_command({}, argv, 1, sfd, system),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[zfd, rfd, sfd, theirs.fileno()],
                env={},
                start_new_session=True,
                preexec_fn=joiner(join),
                close_fds=True,
                **self.slot.popen_ids(),
            )
        finally:
            for fd in (zfd, rfd, sfd, *join):
                os.close(fd)
            theirs.close()
        self.sock.settimeout(10)
        try:
            ready = self.sock.recv(16)
        except OSError:
            ready = b""
        if ready != b"ready":
            self.close()
            raise SandboxUnavailable("the sandbox's supervisor did not start in its container")
        # Bubblewrap (outside and as pid 1 inside) and the supervisor: everything else in the cgroup after a
        # run is the run's, and is killed.
        self.keep = self.cg.pids()
        self.alive = True

    def run(
        self, named: dict[str, bytes], argv: list[str], stdin: bytes, lim: Limits
    ) -> SandboxResult | None:
        """One run; None when the supervisor could not set it up (the caller replaces the container)."""
        cg = self.cg
        nproc = lim.max_procs + 2 + _RUN_OVERHEAD + len(self.keep)
        cg.set_limits(nproc, cg.memory_usage() + (lim.memory_mb << 20))
        ooms = cg.oom_kills()
        header = {
            "files": [[n, len(c)] for n, c in named.items()],
            "argv": argv,
            "limits": {
                "as": lim.memory_mb << 20,
                "cpu": lim.cpu_seconds,
                "fsize": lim.disk_mb << 20,
                "nproc": nproc,
            },
        }
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        t0 = time.monotonic()
        self._send(header, stdin, named, out_w, err_w)
        try:
            return self._collect(Output(out_r, err_r, lim), lim, ooms, t0) if self.alive else None
        finally:
            os.close(out_r)
            os.close(err_r)
            cg.kill_all(spare=self.keep)
            if self.alive and not self.keep <= cg.pids():
                self.alive = False  # the run killed part of the container

    def _send(self, header: dict, stdin: bytes, named: dict[str, bytes], out_w: int, err_w: int) -> None:
        in_fd, files_fd = memfd("stdin", stdin), memfd("files", b"".join(named.values()))
        try:
            socket.send_fds(self.sock, [json.dumps(header).encode()], [in_fd, out_w, err_w, files_fd])
        except OSError:
            self.alive = False
        finally:
            for fd in (in_fd, out_w, err_w, files_fd):
                os.close(fd)

    def _collect(self, out: Output, lim: Limits, ooms: int, t0: float) -> SandboxResult | None:
        got: list[tuple[int, int] | None] = []

        def exited() -> None:  # the program exited (or the supervisor is gone): its leftovers go now
            got.append(self._status(1.0))
            self.cg.kill_all(spare=self.keep)

        reason = out.drain(t0 + lim.timeout_s, watch=(self.sock.fileno(), exited))
        if reason is not None:
            self.cg.kill_all(spare=self.keep)
        status = got[0] if got else self._status(1.0)
        if status is None:  # the supervisor stopped answering
            self.alive = False
            # the kernel's OOM killer took it (the run filled the cgroup): the run's doing, not the sandbox's
            lost = "memory" if self.cg.oom_kills() > ooms else "sandbox_error"
            reason = reason or lost
        elif status[0] != 0:
            self.alive = False  # it could not set the run up
            return None
        return verdict(None if status is None else status[1], reason, out, lim, self.cg, ooms, t0)

    def _status(self, timeout_s: float) -> tuple[int, int] | None:
        if not self.alive:
            return None
        self.sock.settimeout(max(timeout_s, 0.001))
        try:
            msg = self.sock.recv(4096)
        except TimeoutError:
            return None
        except OSError:
            self.alive = False
            return None
        if len(msg) < 8:
            self.alive = False
            return None
        return struct.unpack("!ii", msg[:8])

    def close(self) -> None:
        self.alive = False
        self.cg.kill_all()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        self.sock.close()
        self.slot.release()
