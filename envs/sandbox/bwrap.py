"""The bubblewrap container: the command line that builds a run's namespaces and filesystem.

Covers: a new user, mount, pid, network, IPC, UTS and cgroup namespace (``--unshare-all``); a new root holding
only read-only ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` links), a private ``/proc`` of the
container's pid namespace, four device nodes (null, zero, random, urandom; their bind mounts read-only, so a
run cannot set their timestamps, which are the host's), and the workdir ``/work``: a tmpfs capped at
``disk_mb`` holding the run's files, written from memfds (never a host path). The root is then remounted
read-only; the network namespace has only a down loopback; the environment is cleared and set to a fixed few
variables; the process runs as uid 65534 inside, in a new session, and dies with its parent; the seccomp
program given is installed last.

Does not cover: limits (``cgroup.py``, rlimits), the uid outside (``slots.py``), anything the kernel shares
across namespaces (see the package docstring), and what ``/usr`` holds: it is readable.

    cmd = bwrap_command({"main.py": fd}, [PYTHON, "main.py"], disk_mb=64, seccomp_fd=sfd)
"""

from __future__ import annotations

import os
from pathlib import Path

PYTHON = "/usr/bin/python3"
INSIDE_UID = 65534
# Four device nodes bound into the (read-only) root instead of a whole --dev tmpfs, which costs ~3 ms a run.
_NODES = ("null", "zero", "random", "urandom")
_DEVICES = [a for d in _NODES for a in ("--dev-bind", f"/dev/{d}", f"/dev/{d}")]
_DEVICES_RO = [a for d in _NODES for a in ("--remount-ro", f"/dev/{d}")]


def memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def check_name(name: str) -> str:
    """``name`` normalised, or ValueError unless it is a relative path inside the workdir."""
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
    as_pid_1: bool = False,
) -> list[str]:
    """``files``: memfds placed in /work; ``system``: memfds placed at absolute paths (read-only after setup);
    ``as_pid_1``: ``argv`` is the pid namespace's init (``init.py``), not bubblewrap's own reaper.

    Long: the command line is one list of bubblewrap flags, one per line, each next to the claim it enforces;
    split up, the order in which bubblewrap applies them would no longer be visible."""
    cmd = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/work",
        "--setenv",
        "TMPDIR",
        "/work",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        *_DEVICES,
        *_DEVICES_RO,
        "--size",
        str(disk_mb * 1024 * 1024),
        "--tmpfs",
        "/work",
    ]
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
    cmd += ["--remount-ro", "/", "--chdir", "/work", "--seccomp", str(seccomp_fd)]
    return [*cmd, *(["--as-pid-1"] if as_pid_1 else []), "--", *argv]
