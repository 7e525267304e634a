"""The supervisor inside a pool worker's container (stdlib only; run by the container's /usr/bin/python3).

The worker starts one container (every namespace, read-only root, seccomp, its slot uid, its cgroup) running
this file, then sends it one request per run over a Unix socket: a JSON header and the run's file descriptors
(stdin, stdout, stderr, and a memfd holding the files). For each run it empties /work, writes the files, forks
a child that drops to the run's rlimits (hard limits: the program cannot raise them), starts a session of its
own and execs the interpreter with the container's environment: a fresh process image per run, as
``python3 main.py`` would be. It reports the exit code (128 + N when killed by signal N). The supervisor is not dumpable, so the code it runs cannot read or write its memory or fds
through /proc; if a run kills or stops it, the worker notices and starts a new container.

This file is executed, never imported, by the sandbox.
"""

import ctypes
import json
import os
import resource
import shutil
import socket
import struct
import sys

_PR_SET_DUMPABLE = 4
_WORK = "/work"


def _wipe() -> None:
    for entry in os.scandir(_WORK):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _write_files(files: list, fd: int) -> None:
    with os.fdopen(fd, "rb") as src:
        for name, size in files:
            parent = os.path.dirname(name)
            if parent:
                os.makedirs(os.path.join(_WORK, parent), exist_ok=True)
            with open(os.path.join(_WORK, name), "wb") as dst:
                dst.write(src.read(size))


def _child(req: dict, fds: list) -> None:
    try:
        os.setsid()
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        lim = req["limits"]
        for name, value in (("RLIMIT_AS", lim["as"]), ("RLIMIT_FSIZE", lim["fsize"]),
                            ("RLIMIT_NOFILE", 256), ("RLIMIT_NPROC", lim["nproc"]), ("RLIMIT_CORE", 0)):  # fmt: skip
            resource.setrlimit(getattr(resource, name), (value, value))
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
        os.chdir(_WORK)
        os.execv(req["argv"][0], req["argv"])  # the environment bubblewrap set for the container
    except BaseException as e:  # the exec failed: say why on the run's stderr
        os.write(2, f"sandbox: cannot start {req['argv'][:1]}: {e}\n".encode())
    os._exit(127)


def main() -> None:
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    ctrl.sendall(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 20, 4)
        if not msg:
            return
        req = json.loads(msg)
        try:
            _wipe()
            _write_files(req["files"], fds[3])
        except OSError as e:
            for fd in fds[:3]:
                os.close(fd)
            ctrl.sendall(struct.pack("!ii", 1, 0) + f"setup failed: {e}".encode())
            continue
        pid = os.fork()
        if pid == 0:
            _child(req, fds)
        for fd in fds[:3]:
            os.close(fd)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # as bubblewrap reports it for a one-off run: 128 + N for a program killed by signal N
        ctrl.sendall(struct.pack("!ii", 0, 128 - code if code < 0 else code))


if __name__ == "__main__":
    main()
