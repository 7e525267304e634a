"""The supervisor inside a pool worker's container (stdlib only; run by the container's /usr/bin/python3).

The worker starts one container (every namespace, read-only root, the supervisor's seccomp filter, its slot
uid, its cgroup) running this file, then sends it one request per run over a Unix socket: a JSON header and
the run's file descriptors (stdin, stdout, stderr, and a memfd holding the files). Each run gets namespaces of
its own, so nothing a run leaves in kernel state reaches the next one:

    supervisor --fork--> setup: unshare(user, mount, pid, ipc, uts, net), map its own uid and gid
                   --fork--> init (pid 1 of the new pid namespace): mount a fresh /proc and a fresh tmpfs on
                             /work (capped at disk_mb), write the files, install the run's seccomp filter
                         --fork--> program: its session, stdio, hard rlimits, exec the interpreter

The program therefore starts with a new SysV IPC and POSIX message queue namespace, a new hostname, a network
namespace with only a down loopback, a pid namespace whose counter starts at 1 (and whose /proc shows only its
own processes), and a /work that no earlier run ever touched (no inode numbers, modes, times or xattrs carried
over). When the program exits, init exits and the kernel kills everything left in its pid namespace; the
namespaces and the tmpfs go with the last process. The new user namespace maps only the run's own uid and gid,
and the program execs as that non-root uid, so it holds no capability; the run's seccomp filter (stacked on
the container's) refuses namespace creation and mount again. Init and the supervisor are not dumpable: the
program cannot read their memory or fds through /proc, and the supervisor is not in its pid namespace at all.

It reports the exit code (128 + N when killed by signal N), or that the run could not be set up (the worker
then starts a new container). This file is executed, never imported, by the sandbox.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys

_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
# user, mount, uts, ipc, pid, net: must equal seccomp.RUN_NAMESPACES (the supervisor filter allows only it)
_RUN_NAMESPACES = 0x10000000 | 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000
_WORK = "/work"
_RUN_FILTER = "/.sandbox/run.bpf"
_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _new_namespaces() -> None:
    """Unshare the run's namespaces and map the caller's own uid and gid (and nothing else) into them."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(_RUN_NAMESPACES), "unshare")
    # /proc/self/*_map of a non-dumpable process belong to the (unmapped) host root: dumpable while writing
    _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _fresh_mounts(disk_bytes: int) -> None:
    """A /proc of the run's own pid namespace and an empty tmpfs /work owned by the run's uid."""
    flags = _MS_NOSUID | _MS_NODEV
    _check(_libc.mount(b"proc", b"/proc", b"proc", flags | _MS_NOEXEC, None), "mount /proc")
    opts = f"size={disk_bytes},mode=0755,uid={os.getuid()},gid={os.getgid()}".encode()
    _check(_libc.mount(b"tmpfs", _WORK.encode(), b"tmpfs", flags, opts), "mount /work")


def _write_files(files: list, fd: int) -> None:
    with os.fdopen(fd, "rb") as src:
        for name, size in files:
            parent = os.path.dirname(name)
            if parent:
                os.makedirs(os.path.join(_WORK, parent), exist_ok=True)
            with open(os.path.join(_WORK, name), "wb") as dst:
                dst.write(src.read(size))


def _install_filter(bpf: bytes) -> None:
    prog = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _SockFprog(len(bpf) // 8, ctypes.addressof(prog))
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _exec_program(req: dict, fds: list) -> None:
    try:
        os.setsid()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python, default for any program started
            signal.signal(sig, signal.SIG_DFL)
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        lim = req["limits"]
        for name, value in (
            ("RLIMIT_AS", lim["as"]),
            ("RLIMIT_FSIZE", lim["fsize"]),
            ("RLIMIT_NOFILE", 256),
            ("RLIMIT_NPROC", lim["nproc"]),
            ("RLIMIT_CORE", 0),
        ):
            resource.setrlimit(getattr(resource, name), (value, value))
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
        os.chdir(_WORK)
        os.execv(req["argv"][0], req["argv"])  # the environment bubblewrap set for the container
    except BaseException as e:  # the exec failed: say why on the run's stderr
        os.write(2, f"sandbox: cannot start {req['argv'][:1]}: {e}\n".encode())
    os._exit(127)


def _init(req: dict, fds: list, bpf: bytes, report: int) -> None:
    """Pid 1 of the run: set up, start the program, exit with its status (the kernel kills what is left).
    Every signal at its default (SIGINT had Python's handler), which pid 1 ignores from inside its namespace:
    the program cannot stop it or change the status it reports."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        _fresh_mounts(req["limits"]["fsize"])
        _write_files(req["files"], fds[3])
        _install_filter(bpf)
    except BaseException as e:
        os.write(report, f"setup failed: {e}".encode())
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        _exec_program(req, fds)
    for fd in [*fds[:3], report]:
        os.close(fd)
    while True:  # as pid 1, reap orphans until the program itself exits
        done, status = os.waitpid(-1, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def _setup(req: dict, fds: list, bpf: bytes, report: int) -> None:
    """The run's first process: new namespaces, then their init; exits with init's status."""
    try:
        _new_namespaces()
        pid = os.fork()
    except BaseException as e:
        os.write(report, f"setup failed: {e}".encode())
        os._exit(1)
    if pid == 0:
        _init(req, fds, bpf, report)
    for fd in [*fds, report]:
        os.close(fd)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)


def _one_run(ctrl: socket.socket, req: dict, fds: list, bpf: bytes) -> None:
    report_r, report_w = os.pipe()  # close-on-exec: EOF once the program has exec'd (or setup failed)
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        _setup(req, fds, bpf, report_w)
    for fd in [*fds, report_w]:
        os.close(fd)
    with os.fdopen(report_r, "rb") as r:
        failure = r.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if failure:
        ctrl.sendall(struct.pack("!ii", 1, 0) + failure)
    else:  # as bubblewrap reports it for a one-off run: 128 + N for a program killed by signal N
        ctrl.sendall(struct.pack("!ii", 0, 128 - code if code < 0 else code))


def main() -> None:
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open(_RUN_FILTER, "rb") as f:
        bpf = f.read()
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    ctrl.sendall(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 20, 4)
        if not msg:
            return
        _one_run(ctrl, json.loads(msg), fds, bpf)


if __name__ == "__main__":
    main()
