"""The seccomp filters: which system calls sandboxed code may not make.

Covers: the kernel's most exposed interfaces are refused with EPERM (ptrace and cross-process memory access,
mount and the new mount API, namespace creation: unshare, setns, clone with namespace flags, kernel keyrings,
bpf, perf_event_open, userfaultfd, io_uring, kernel modules, kexec, reboot, swap, clock changes,
open_by_handle_at, syslog, quotactl, fanotify, personality, ioperm/iopl), sockets of any family but AF_UNIX
with EAFNOSUPPORT, and clone3 with ENOSYS (its flags sit in a struct a filter cannot read; libc then falls
back to clone, whose flags are checked). Every name must resolve on this architecture: a misspelt or unknown
syscall is an error (``SandboxUnavailable``), never a rule silently left out.

Two programs: ``run_filter()`` for the code being run, and ``supervisor_filter()`` for the supervisor of a
reused container (``zygote.py``), which additionally may call ``unshare`` with exactly ``RUN_NAMESPACES`` and
``mount`` so it can give each run namespaces, a /proc and a /work of its own; it installs ``run_filter()`` in
each run before the run's code starts (filters stack, so the run gets the stricter one).

Does not cover: bugs in the allowed system calls (the kernel is shared), and resource exhaustion through
allowed calls (``cgroup.py`` and the rlimits bound that).

    from envs.sandbox.seccomp import run_filter
    bpf = run_filter()  # bytes: a BPF program for bwrap --seccomp or prctl(PR_SET_SECCOMP)
"""

from __future__ import annotations

import errno
import functools
import tempfile

from envs.sandbox.limits import SandboxUnavailable

DENIED = [
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    "quotactl",
    "lookup_dcookie",
    "fanotify_init",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fspick",
    "mount_setattr",
    "personality",
    "vhangup",
    "iopl",
    "ioperm",
]
# Syscalls that exist only on some architectures: where they do not exist there is nothing to refuse.
ARCH_OPTIONAL = frozenset({"iopl", "ioperm"})  # x86 port I/O
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
_CLONE_NS_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
    CLONE_NEWTIME,
)
# The namespaces each run of a reused container gets (zygote.py spells the number out: it imports nothing).
RUN_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
_AF_UNIX = 1
# What the supervisor of a reused container needs beyond a run: per-run namespaces and mounts.
_SUPERVISOR_ALLOWED = frozenset({"unshare", "mount"})


def _seccomp():  # noqa: ANN202  (the pyseccomp module)
    try:
        import pyseccomp
    except (ImportError, OSError) as e:
        raise SandboxUnavailable(
            f"libseccomp is not usable ({e}): install the pyseccomp package and libseccomp2"
        ) from e
    return pyseccomp


def resolve(name: str) -> int | None:
    """The syscall number of ``name`` here; None for an ``ARCH_OPTIONAL`` one this architecture lacks.
    Raises ``SandboxUnavailable`` for any other name libseccomp cannot resolve."""
    sc = _seccomp()
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if nr >= 0:
        return nr
    if name in ARCH_OPTIONAL and nr != -1:  # -1: no such name anywhere; below: not on this architecture
        return None
    raise SandboxUnavailable(
        f"seccomp: cannot resolve the syscall {name!r} on this architecture (libseccomp returned {nr}); "
        "refusing to build a filter that would silently leave it allowed"
    )


def _compile(denied: list[str], supervisor: bool) -> bytes:
    sc = _seccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    for name in denied:
        nr = resolve(name)
        if nr is not None:
            f.add_rule(sc.ERRNO(errno.EPERM), nr)
    if supervisor:
        f.add_rule(sc.ERRNO(errno.EPERM), resolve("unshare"), sc.Arg(0, sc.NE, RUN_NAMESPACES))
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    for flag in _CLONE_NS_FLAGS:  # one rule per flag: a masked compare matches all bits of its mask at once
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()


@functools.cache
def run_filter() -> bytes:
    """The BPF program every run's code executes under (built once per process)."""
    return _compile(DENIED, supervisor=False)


@functools.cache
def supervisor_filter() -> bytes:
    """The BPF program of a reused container's supervisor: ``run_filter()`` but unshare(RUN_NAMESPACES)
    and mount, which it needs to set each run up before installing ``run_filter()`` in it."""
    return _compile([n for n in DENIED if n not in _SUPERVISOR_ALLOWED], supervisor=True)
