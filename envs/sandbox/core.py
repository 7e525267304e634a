"""The sandbox's mechanics: bubblewrap command line, seccomp program, cgroup, rlimits, per-slot uid, output caps.

See the package docstring for what it protects against. One ``Sandbox.run`` is one fresh container.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import math
import os
import random
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

Mode = Literal["strict", "rlimits"]
UID_BASE = 61000  # outside uid of slot i is UID_BASE + i: one uid per concurrent run
SLOTS = 1024
OUTPUT_KILL_FACTOR = 16
PYTHON = "/usr/bin/python3"
_INSIDE_UID = 65534
_PR_SET_CHILD_SUBREAPER = 36
# Four device nodes bound into the (read-only) root instead of a whole --dev tmpfs, which costs ~3 ms a run.
_DEVICES = [
    a for d in ("null", "zero", "random", "urandom") for a in ("--dev-bind", f"/dev/{d}", f"/dev/{d}")
]


def configured_mode() -> Mode:
    """The mode environments use: ``$RLFOUNDRY_SANDBOX_MODE`` (strict unless it names the weaker one)."""
    mode = os.environ.get("RLFOUNDRY_SANDBOX_MODE", "strict")
    if mode not in ("strict", "rlimits"):
        raise SandboxUnavailable(f"RLFOUNDRY_SANDBOX_MODE={mode!r}: must be strict or rlimits")
    return mode  # type: ignore[return-value]


class SandboxUnavailable(RuntimeError):
    """A mechanism the sandbox needs is missing here; the message says which and what to do."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_s: float | None = None  # default: the timeout
    max_procs: int = 32
    disk_mb: int = 64
    output_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_procs", "disk_mb", "output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    """What happened to one run. ``stopped_reason``: None (it exited by itself), "timeout", "memory",
    "cpu", "output_limit", "signal:<NAME>", or "sandbox_error" (it killed its container's supervisor)."""

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


# -- seccomp --------------------------------------------------------------------------------------------
_DENIED = [
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "open_by_handle_at", "name_to_handle_at", "syslog", "quotactl",
    "lookup_dcookie", "fanotify_init", "move_mount", "open_tree", "fsopen", "fsmount", "fspick",
    "mount_setattr", "personality", "vhangup", "iopl", "ioperm",
]  # fmt: skip
_CLONE_NS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
)
_AF_UNIX = 1


@functools.cache
def seccomp_program() -> bytes:
    """The compiled BPF program (built once per process)."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:
        raise SandboxUnavailable(
            f"libseccomp is not usable ({e}): install the pyseccomp package and libseccomp2"
        ) from e
    f = sc.SyscallFilter(sc.ALLOW)
    for name in _DENIED:
        with contextlib.suppress(Exception):  # a syscall this kernel/arch lacks
            f.add_rule(sc.ERRNO(errno.EPERM), name)
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_NS, _CLONE_NS))
    # clone3 passes flags in a struct seccomp cannot read: refuse it, libc falls back to clone.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()


# -- cgroups --------------------------------------------------------------------------------------------
_CG = Path("/sys/fs/cgroup")


class Cgroup:
    """A per-run cgroup with pids and memory limits (cgroup v2, or v1's pids and memory hierarchies)."""

    def __init__(self, name: str, pids_max: int, memory_bytes: int):
        self.dirs: list[Path] = []
        try:
            if _cgroup_v2():
                parent = _CG / "rlfoundry-sandbox"
                parent.mkdir(exist_ok=True)
                _write(_CG / "cgroup.subtree_control", "+pids +memory")
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
                    parent = _CG / ctrl / "rlfoundry-sandbox"
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
        """SIGKILL every process in the cgroup (but ``spare``: a pid or a set) and wait until they are gone."""
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


def _sweep_dead_workers() -> None:
    """Remove the (empty) cgroups of pool workers that died without cleaning up (SIGKILLed)."""
    for d in list(_CG.glob("rlfoundry-sandbox/worker-*")) + list(_CG.glob("*/rlfoundry-sandbox/worker-*")):
        pid = d.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):  # not empty (still in use): leave it
                d.rmdir()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@functools.cache
def _cgroup_v2() -> bool:
    ctrl = _CG / "cgroup.controllers"
    return ctrl.exists() and {"pids", "memory"} <= set(ctrl.read_text().split())


# -- slots ------------------------------------------------------------------------------------------------
class _Slot:
    """An exclusive slot (flock on a file) across every process of this machine: its own outside uid."""

    def __init__(self) -> None:
        d = Path(tempfile.gettempdir()) / f"rlfoundry-sandbox-slots-{os.geteuid()}"
        d.mkdir(mode=0o700, exist_ok=True)
        if d.stat().st_uid != os.geteuid() or d.stat().st_mode & 0o077:
            raise SandboxUnavailable(f"{d} is not private to this user: refusing to use it for slot locks")
        start = random.randrange(SLOTS)
        for k in range(SLOTS):
            i = (start + k) % SLOTS
            fd = os.open(d / f"{i}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.index, self.fd = i, fd
            return
        raise RuntimeError(f"all {SLOTS} sandbox slots are busy")

    def release(self) -> None:
        os.close(self.fd)


# -- the run ------------------------------------------------------------------------------------------
def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _check_name(name: str) -> str:
    parts = Path(name).parts
    if not name or name.startswith("/") or "\0" in name or ".." in parts or not parts:
        raise ValueError(f"sandbox file name {name!r} must be a relative path inside the workdir")
    return "/".join(parts)


def bwrap_command(
    files: dict[str, int],
    argv: list[str],
    disk_mb: int,
    seccomp_fd: int,
    system: dict[str, int] | None = None,
) -> list[str]:
    """``files``: memfds placed in /work; ``system``: memfds placed at absolute paths (read-only after setup)."""
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
           "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/work",
           "--setenv", "TMPDIR", "/work", "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
           "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID), "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
           "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
           "--proc", "/proc", *_DEVICES, "--size", str(disk_mb * 1024 * 1024), "--tmpfs", "/work"]  # fmt: skip
    made: set[str] = set()
    for name, fd in files.items():
        parent = ""
        for part in name.split("/")[:-1]:
            parent = f"{parent}/{part}"
            if parent not in made:
                cmd += ["--dir", f"/work{parent}"]
                made.add(parent)
        cmd += ["--file", str(fd), f"/work/{name}"]
    for path, fd in (system or {}).items():
        cmd += ["--file", str(fd), path]
    cmd += ["--remount-ro", "/", "--chdir", "/work", "--seccomp", str(seccomp_fd), "--", *argv]
    return cmd


class Sandbox:
    """Runs untrusted programs, one fresh container per ``run``.

    ``dedicated=True`` (a process that only runs sandboxes: the pool's workers, ``rlfoundry sandbox exec``):
    the process becomes a child subreaper and reaps every orphan after each run (bubblewrap's pid-1 process
    outlives its parent for a moment, and a host init that does not reap would keep it as a zombie, charged to
    the slot uid's process limit), and it moves once into a cgroup of its own so every run it starts is born
    inside it (no per-run cgroup migration, ~7 ms on cgroup v1); before each run that cgroup's limits are set to
    the run's (memory: the process's own usage + ``memory_mb``), after it every process in it but this one is
    killed. Otherwise each run gets a cgroup of its own; use the pool from long-lived processes.
    """

    def __init__(self, mode: Mode = "strict", *, dedicated: bool = False, reuse: bool = False):
        check_available(mode)
        self.mode = mode
        self.dedicated = dedicated
        self.reuse = reuse and dedicated and mode == "strict"
        self._box: _Container | None = None
        self._own: Cgroup | None = None
        if dedicated:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if dedicated and mode == "strict":
            _sweep_dead_workers()
            self._own = Cgroup(f"worker-{os.getpid()}-{secrets.token_hex(4)}", 64, 1 << 40)
            for fd in self._own.join_fds():
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            atexit.register(self.close)

    def close(self) -> None:
        """Leave and remove the worker cgroup (pool workers, at exit)."""
        if self._box is not None:
            self._box.close()
            self._box = None
        if self._own is not None:
            self._own.kill_all(spare=os.getpid())
            self._own.leave(os.getpid())
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
        named = {_check_name(n): (c.encode() if isinstance(c, str) else c) for n, c in files.items()}
        total = sum(len(c) for c in named.values())
        if total > lim.disk_mb * 1024 * 1024:
            raise ValueError(f"sandbox files total {total} bytes, more than disk_mb={lim.disk_mb}")
        if self.reuse and self._own is not None:
            return self._run_reused(named, argv, stdin, lim)
        slot = _Slot()
        fds: list[int] = []
        cg: Cgroup | None = None
        try:
            file_fds = {n: _memfd(n, c) for n, c in named.items()}
            fds += file_fds.values()
            sfd = _memfd("seccomp", seccomp_program())
            in_fd = _memfd("stdin", stdin)
            fds += [sfd, in_fd]
            join: list[int] = []
            if self._own is not None:
                cg = self._own
                cg.set_limits(lim.max_procs + 3, cg.memory_usage() + (lim.memory_mb << 20))
            elif self.mode == "strict":
                cg = Cgroup(
                    f"run-{slot.index}-{secrets.token_hex(4)}", lim.max_procs + 2, lim.memory_mb << 20
                )
                join = cg.join_fds()
                fds += join
            ooms = cg.oom_kills() if cg else 0
            cpu = max(1, math.ceil(lim.cpu_s if lim.cpu_s is not None else lim.timeout_s))
            # rlimits through util-linux prlimit, so the child needs no Python between fork and exec
            prlimit = ["prlimit", f"--as={lim.memory_mb << 20}", f"--cpu={cpu}:{cpu + 1}",
                       f"--fsize={lim.disk_mb << 20}", "--nofile=256", f"--nproc={lim.max_procs + 2}", "--core=0", "--"]  # fmt: skip
            cmd = prlimit + bwrap_command(file_fds, argv, lim.disk_mb, sfd)
            uid = UID_BASE + slot.index if os.geteuid() == 0 else None

            def join_cgroup() -> None:  # one-off runs only: between fork and exec, only syscalls
                for fd in join:
                    os.write(fd, b"0")

            return _execute(
                cmd, in_fd, [*file_fds.values(), sfd], join_cgroup if join else None, uid, lim, cg, ooms
            )
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if cg is not None:
                cg.kill_all(spare=os.getpid())
                if cg is not self._own:
                    cg.remove()
            if self.dedicated:
                _reap()
            slot.release()

    def _run_reused(
        self, named: dict[str, bytes], argv: list[str], stdin: bytes, lim: Limits
    ) -> SandboxResult:
        assert self._own is not None
        try:
            for _ in range(2):  # a container that could not set the run up is replaced once
                if self._box is not None and (not self._box.alive or self._box.disk_mb != lim.disk_mb):
                    self._box.close()
                    self._box = None
                if self._box is None:
                    self._box = _Container(self._own, lim.disk_mb)
                res = self._box.run(named, argv, stdin, lim)
                if res is not None:
                    return res
            raise SandboxUnavailable("the sandbox's supervisor could not set up a run in a fresh container")
        finally:
            if self._box is not None and not self._box.alive:
                self._box.close()
                self._box = None
            _reap()


def slot_processes() -> list[int]:
    """Live (non-zombie) processes of this machine running as any sandbox slot uid: after a run, none."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            if UID_BASE <= uid < UID_BASE + SLOTS and status.split("\nState:")[1].split()[0] != "Z":
                out.append(int(d.name))
    return out


def _reap() -> None:
    """Collect every exited child (orphans included, as a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _execute(
    cmd: list[str], stdin_fd: int, pass_fds: list[int], child: Any, uid: int | None, lim: Limits,
    cg: Cgroup | None, ooms_before: int,
) -> SandboxResult:  # fmt: skip
    t0 = time.monotonic()
    ids: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    proc = subprocess.Popen(
        cmd, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds,
        env={}, start_new_session=True, preexec_fn=child, close_fds=True, **ids,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    out = _Output(proc.stdout.fileno(), proc.stderr.fileno(), lim)
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
            cg.kill_all(spare=os.getpid())
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return _verdict(proc.returncode, reason, out, lim, cg, ooms_before, t0)


class _Output:
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


def _verdict(
    code: int | None, reason: str | None, out: _Output, lim: Limits, cg: Cgroup | None, ooms_before: int,
    t0: float,
) -> SandboxResult:  # fmt: skip
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


class _Container:
    """The long-lived container of a dedicated strict worker (``Sandbox(reuse=True)``): one bubblewrap
    container with the same namespaces, read-only root, seccomp filter, slot uid and cgroup as a one-off run,
    running ``zygote.py``, which forks and execs a fresh interpreter per run in an emptied /work. It saves the
    container set-up (~5 ms of a ~17 ms run here) and is restarted whenever the supervisor dies, stops
    answering or cannot empty /work."""

    def __init__(self, cg: Cgroup, disk_mb: int):
        self.cg, self.disk_mb = cg, disk_mb
        self.slot = _Slot()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zfd = _memfd("zygote", (Path(__file__).parent / "zygote.py").read_bytes())
        sfd = _memfd("seccomp", seccomp_program())
        argv = [PYTHON, "-I", "/.sandbox/zygote.py", str(theirs.fileno())]
        cmd = bwrap_command({}, argv, disk_mb, sfd, {"/.sandbox/zygote.py": zfd})
        uid = UID_BASE + self.slot.index if os.geteuid() == 0 else None
        ids: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=[zfd, sfd, theirs.fileno()], env={}, start_new_session=True, close_fds=True, **ids,
            )  # fmt: skip
        finally:
            for fd in (zfd, sfd):
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
        # The worker, bubblewrap (outside and as pid 1 inside) and the supervisor: everything else in the
        # cgroup after a run is the run's, and is killed.
        self.keep = self.cg.pids()
        self.alive = True

    def run(
        self, named: dict[str, bytes], argv: list[str], stdin: bytes, lim: Limits
    ) -> SandboxResult | None:
        """One run; None when the supervisor could not set it up (the caller restarts the container)."""
        cg = self.cg
        cg.set_limits(lim.max_procs + 2 + len(self.keep), cg.memory_usage() + (lim.memory_mb << 20))
        ooms = cg.oom_kills()
        cpu = max(1, math.ceil(lim.cpu_s if lim.cpu_s is not None else lim.timeout_s))
        header = {
            "files": [[n, len(c)] for n, c in named.items()],
            "argv": argv,
            "limits": {"as": lim.memory_mb << 20, "cpu": cpu, "fsize": lim.disk_mb << 20,
                       "nproc": lim.max_procs + 2 + len(self.keep)},
        }  # fmt: skip
        in_fd, files_fd = _memfd("stdin", stdin), _memfd("files", b"".join(named.values()))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        t0 = time.monotonic()
        try:
            socket.send_fds(self.sock, [json.dumps(header).encode()], [in_fd, out_w, err_w, files_fd])
        except OSError:
            self.alive = False
        finally:
            for fd in (in_fd, out_w, err_w, files_fd):
                os.close(fd)
        try:
            if not self.alive:
                return None
            out = _Output(out_r, err_r, lim)
            got: list[tuple[int, int] | None] = []

            def exited() -> None:  # the program exited (or the supervisor is gone): its leftovers go now
                got.append(self._status(1.0))
                cg.kill_all(spare=self.keep)

            reason = out.drain(t0 + lim.timeout_s, watch=(self.sock.fileno(), exited))
            if reason is not None:
                cg.kill_all(spare=self.keep)
            status = got[0] if got else self._status(1.0)
            if status is None:  # the program killed or stopped the supervisor
                self.alive = False
                reason = reason or "sandbox_error"
            elif status[0] != 0:
                self.alive = False  # it could not empty /work or write the files
                return None
            return _verdict(None if status is None else status[1], reason, out, lim, cg, ooms, t0)
        finally:
            os.close(out_r)
            os.close(err_r)
            cg.kill_all(spare=self.keep)
            if self.alive and not self.keep <= cg.pids():
                self.alive = False  # the run killed part of the container

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
        self.cg.kill_all(spare=os.getpid())
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        self.sock.close()
        self.slot.release()


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
    seccomp_program()
    if mode == "strict":
        try:
            Cgroup(f"probe-{os.getpid()}-{secrets.token_hex(3)}", 4, 64 << 20).remove()
        except OSError as e:
            raise SandboxUnavailable(
                f"cannot create a per-run cgroup under {_CG} ({e}); without it memory and process limits are "
                "rlimits only. Set sandbox.mode=rlimits to accept that weaker isolation."
            ) from e
    sfd = _memfd("seccomp", seccomp_program())
    try:
        r = subprocess.run(
            bwrap_command({}, ["/usr/bin/true"], 1, sfd), pass_fds=[sfd], env={}, capture_output=True, timeout=30,
            preexec_fn=(lambda: (os.setgroups([]), os.setresgid(UID_BASE, UID_BASE, UID_BASE),
                                 os.setresuid(UID_BASE, UID_BASE, UID_BASE))) if os.geteuid() == 0 else None,
        )  # fmt: skip
    finally:
        os.close(sfd)
    if r.returncode != 0:
        raise SandboxUnavailable(
            "bubblewrap cannot create its namespaces here (user namespaces disabled, or a container whose seccomp "
            f"profile forbids them): {r.stderr.decode(errors='replace').strip()}. The sandbox refuses to run code "
            "without them; in Kubernetes give the pod a seccomp profile allowing user namespaces, or a gVisor/Kata "
            "runtime class."
        )
