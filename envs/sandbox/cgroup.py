"""Per-run cgroups: the memory and process limits of a run, and the means to kill everything it started.

Covers: a run's processes cannot together use more than ``memory_mb`` of memory (page cache and tmpfs
included; swap is set to 0 where the kernel allows) or hold more than ``max_procs`` (+ the sandbox's own few)
processes at once, whatever their uids or sessions; ``kill_all`` finds every process a run started, including
daemons that left its session or process group; ``oom_kills`` tells a memory kill from a crash. Works on
cgroup v2 and on v1's pids and memory hierarchies.

Does not cover: CPU share (only the per-process RLIMIT_CPU and the wall-clock timeout bound CPU), I/O
bandwidth, kernel memory outside the memory controller. Without write access to /sys/fs/cgroup there is no
cgroup: ``Sandbox`` then refuses unless the weaker mode is named explicitly.

    cg = Cgroup("run-1", pids_max=34, memory_bytes=512 << 20)
    ...  # start the run with cg.join_fds()
    cg.kill_all(); cg.remove()
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

CG_ROOT = Path("/sys/fs/cgroup")
PARENT = "rlfoundry-sandbox"


class Cgroup:
    """A per-run cgroup with pids and memory limits (cgroup v2, or v1's pids and memory hierarchies)."""

    def __init__(self, name: str, pids_max: int, memory_bytes: int):
        self.dirs: list[Path] = []
        try:
            if _cgroup_v2():
                parent = CG_ROOT / PARENT
                parent.mkdir(exist_ok=True)
                _write(CG_ROOT / "cgroup.subtree_control", "+pids +memory")
                _write(parent / "cgroup.subtree_control", "+pids +memory")
                d = parent / name
                d.mkdir()
                self.dirs = [d]
                _write(d / "pids.max", str(pids_max))
                _write(d / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            else:
                for ctrl in ("pids", "memory"):
                    parent = CG_ROOT / ctrl / PARENT
                    parent.mkdir(exist_ok=True)
                    d = parent / name
                    d.mkdir()
                    self.dirs.append(d)
                _write(self.dirs[0] / "pids.max", str(pids_max))
                _write(self.dirs[1] / "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(self.dirs[1] / "memory.memsw.limit_in_bytes", str(memory_bytes))
        except OSError:
            self.remove()
            raise

    def join_fds(self) -> list[int]:
        """Open cgroup.procs files; the child writes "0" to each before exec to join."""
        return [os.open(d / "cgroup.procs", os.O_WRONLY) for d in self.dirs]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        return out

    def kill_all(self, timeout_s: float = 5.0, spare: int | set[int] | None = None) -> None:
        """SIGKILL every process in the cgroup (but ``spare``: a pid or a set) and wait until all are gone."""
        keep = spare if isinstance(spare, set) else set() if spare is None else {spare}
        deadline = time.monotonic() + timeout_s
        pids = self.pids() - keep
        if pids and not keep and self.dirs and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        while pids and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
            pids = self.pids() - keep

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this cgroup so far."""
        n = 0
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (d / name).read_text().splitlines():
                        key, _, val = line.partition(" ")
                        if key == "oom_kill":
                            n += int(val)
        return n

    def _file(self, v2: str, v1: str) -> Path:
        return self.dirs[0] / v2 if _cgroup_v2() else self.dirs[1 if v1.startswith("memory") else 0] / v1

    def set_limits(self, pids_max: int, memory_bytes: int) -> None:
        _write(self._file("pids.max", "pids.max"), str(pids_max))
        mem = self._file("memory.max", "memory.limit_in_bytes")
        if not _cgroup_v2():  # v1: memsw must stay >= the memory limit, so order the two writes
            memsw = self.dirs[1] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                with contextlib.suppress(OSError):
                    _write(memsw, str(max(memory_bytes, int(mem.read_text()))))
                _write(mem, str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(memsw, str(memory_bytes))
                return
        _write(mem, str(memory_bytes))

    def memory_usage(self) -> int:
        return int(self._file("memory.current", "memory.usage_in_bytes").read_text())

    def leave(self, pid: int) -> None:
        """Move ``pid`` back to the root cgroup(s)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                _write(d.parent.parent / "cgroup.procs", str(pid))

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(1000):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.001)


def joiner(fds: list[int]) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the new process into the cgroup(s) whose ``cgroup.procs`` are open as
    ``fds`` (``Cgroup.join_fds``), between fork and exec: only system calls, no allocation."""

    def join() -> None:
        for fd in fds:
            os.write(fd, b"0")

    return join


def sweep_dead_workers() -> None:
    """Remove the (empty) cgroups of pool workers that died without cleaning up (SIGKILLed)."""
    dirs = list(CG_ROOT.glob(f"{PARENT}/worker-*")) + list(CG_ROOT.glob(f"*/{PARENT}/worker-*"))
    for d in dirs:
        pid = d.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):  # not empty (still in use): leave it
                d.rmdir()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@functools.cache
def _cgroup_v2() -> bool:
    ctrl = CG_ROOT / "cgroup.controllers"
    return ctrl.exists() and {"pids", "memory"} <= set(ctrl.read_text().split())
