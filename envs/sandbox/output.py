"""Output capture and the verdict of a run: what the caller gets back.

Covers: stdout and stderr are read concurrently until both close (a program cannot block the caller by filling
one pipe), each kept up to ``output_bytes``; a program that writes more than ``OUTPUT_KILL_FACTOR`` times that
in total is stopped ("output_limit"), so output cannot exhaust the caller's memory or time; the wall-clock
deadline is enforced while reading. The verdict names why a run stopped (timeout, memory, cpu, output_limit,
signal, sandbox_error) from the exit status, the cgroup's OOM-kill count and the limits.

Does not cover: what the output says (it is untrusted text: callers must parse it, never evaluate it).

    out = Output(stdout_fd, stderr_fd, limits); reason = out.drain(deadline)
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from envs.sandbox.cgroup import Cgroup
from envs.sandbox.limits import Limits

OUTPUT_KILL_FACTOR = 16


@dataclass
class SandboxResult:
    """What happened to one run. ``stopped_reason``: None (it exited by itself), "timeout", "memory",
    "cpu", "output_limit", "signal:<NAME>", or "sandbox_error" (its container's supervisor was lost)."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    stopped_reason: str | None
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Output:
    """A run's stdout and stderr read until EOF, each kept up to ``output_bytes``."""

    def __init__(self, out_fd: int, err_fd: int, lim: Limits):
        self.fds = (out_fd, err_fd)
        self.bufs = {out_fd: bytearray(), err_fd: bytearray()}
        self.seen = dict.fromkeys(self.fds, 0)
        self.lim = lim

    def drain(self, deadline: float, watch: tuple[int, Any] | None = None) -> str | None:
        """Read until both close; "timeout" at ``deadline``, "output_limit" past the kill threshold.
        ``watch``: (fd, callback) called once when fd becomes readable (the program's exit status)."""
        sel = selectors.DefaultSelector()
        for fd in self.fds:
            sel.register(fd, selectors.EVENT_READ)
        if watch is not None:
            sel.register(watch[0], selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    if watch is not None and key.fd == watch[0]:
                        sel.unregister(key.fd)
                        watch[1]()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    self.seen[key.fd] += len(chunk)
                    room = self.lim.output_bytes - len(self.bufs[key.fd])
                    if room > 0:
                        self.bufs[key.fd] += chunk[:room]
                if sum(self.seen.values()) > OUTPUT_KILL_FACTOR * self.lim.output_bytes:
                    return "output_limit"
            return None
        finally:
            sel.close()

    def text(self, i: int) -> tuple[bytes, bool]:
        fd = self.fds[i]
        return bytes(self.bufs[fd]), self.seen[fd] > len(self.bufs[fd])


def verdict(
    code: int | None,
    reason: str | None,
    out: Output,
    lim: Limits,
    cg: Cgroup | None,
    ooms_before: int,
    t0: float,
) -> SandboxResult:
    stdout, out_cut = out.text(0)
    err, err_cut = out.text(1)
    if reason is None:
        if cg is not None and cg.oom_kills() > ooms_before:
            reason = "memory"
        elif code == 128 + signal.SIGXCPU or (
            code == 128 + signal.SIGKILL and lim.cpu_s is not None and time.monotonic() - t0 >= lim.cpu_s
        ):
            reason = "cpu"
        elif b"MemoryError" in err[-2000:]:
            reason = "memory"
        elif code is not None and code > 128:
            reason = (
                f"signal:{signal.Signals(code - 128).name}" if code - 128 in signal.valid_signals() else None
            )
    return SandboxResult(
        exit_code=None if reason in ("timeout", "output_limit") else code,
        timed_out=reason == "timeout",
        stdout=stdout.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        stopped_reason=reason,
        duration_s=round(time.monotonic() - t0, 4),
    )
