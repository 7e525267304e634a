"""Runs of one reused pool container inherit nothing from each other: one attack per kind of kernel state.

Each test runs, in the same container (checked: no container was replaced in between), a reader, then a writer
that leaves a secret in one kind of state that outlives its processes, then the reader again. The reader must
see exactly what it saw before the writer ran. Before each run got namespaces of its own (``zygote.py``), the
SysV IPC, POSIX message queue, abstract socket, pid counter and /work metadata channels all leaked the secret.

    .venv/bin/pytest -q tests/sandbox/test_sandbox_reuse.py
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from envs.sandbox import Limits, seccomp
from envs.sandbox.pool import SandboxPool
from envs.sandbox.slots import slot_processes

SECRET = 417  # small enough to be a semaphore value, a file count and a number of forks

_IPC = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
KEY, CREAT, NOWAIT = 0x5EC7, 0o1000, 0o4000
def err():
    return os.strerror(ctypes.get_errno())
"""

# kind: (writer, reader); the reader prints one JSON value
CHANNELS = {
    "sysv_shm": (
        _IPC
        + """
sid = libc.shmget(KEY, 4096, CREAT | 0o666)
ctypes.memmove(libc.shmat(sid, None, 0), b"secret-417", 10)
""",
        _IPC
        + """
sid = libc.shmget(KEY, 0, 0)
print(json.dumps(ctypes.string_at(libc.shmat(sid, None, 0), 10).decode() if sid >= 0 else err()))
""",
    ),
    "sysv_semaphore": (
        _IPC
        + """
sem = libc.semget(KEY, 1, CREAT | 0o666)
assert libc.semctl(sem, 0, 16, ctypes.c_int(417)) == 0  # SETVAL
""",
        _IPC
        + """
sem = libc.semget(KEY, 0, 0)
print(json.dumps(libc.semctl(sem, 0, 12) if sem >= 0 else err()))  # GETVAL
""",
    ),
    "sysv_message_queue": (
        _IPC
        + """
mid = libc.msgget(KEY, CREAT | 0o666)
buf = ctypes.create_string_buffer((1).to_bytes(8, "little") + b"secret-417")
assert libc.msgsnd(mid, buf, 10, 0) == 0
""",
        _IPC
        + """
mid = libc.msgget(KEY, 0)
buf = ctypes.create_string_buffer(8 + 64)
n = libc.msgrcv(mid, buf, 64, 0, NOWAIT) if mid >= 0 else -1
print(json.dumps(buf.raw[8:8 + n].decode() if n > 0 else err()))
""",
    ),
    "posix_message_queue": (
        _IPC
        + """
mq = libc.mq_open(b"/secret", os.O_CREAT | os.O_RDWR, 0o666, None)
assert libc.mq_send(mq, b"secret-417", 10, 0) == 0
""",
        _IPC
        + """
mq = libc.mq_open(b"/secret", os.O_RDONLY | os.O_NONBLOCK, 0, None)
buf = ctypes.create_string_buffer(8192)
n = libc.mq_receive(mq, buf, 8192, None) if mq >= 0 else -1
print(json.dumps(buf.raw[:n].decode() if n > 0 else err()))
""",
    ),
    # a bound socket kept alive after its process died by a reference to itself in flight
    "abstract_unix_socket": (
        """
import socket
a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
a.bind(b"\\0secret-417")
a.connect(b"\\0secret-417")
socket.send_fds(a, [b"x"], [a.fileno()])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\\0secret-stream")
s.listen()
b1, b2 = socket.socketpair()
socket.send_fds(b1, [b"x"], [s.fileno(), b1.fileno(), b2.fileno()])
""",
        """
import json, socket
out = {}
for key, name, kind in (("dgram", b"\\0secret-417", socket.SOCK_DGRAM),
                        ("stream", b"\\0secret-stream", socket.SOCK_STREAM)):
    try:
        socket.socket(socket.AF_UNIX, kind).connect(name)
        out[key] = "CONNECTED"
    except OSError as e:
        out[key] = e.strerror
out["unix"] = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:] if "@" in line]
print(json.dumps(out))
""",
    ),
    "pid_counter": (
        """
import os
for _ in range(417):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
""",
        """
import json, os
print(json.dumps([
    os.getpid(),
    open("/proc/sys/kernel/ns_last_pid").read(),
    open("/proc/loadavg").read().split()[-1],
]))
""",
    ),
    "workdir_metadata": (
        """
import os
for i in range(417):
    open(f"f{i}", "w").close()
os.chmod("/work", 0o700 | 0o41)
os.setxattr("/work", "user.secret", b"secret-417")
os.utime("/work", (2_000_000_417, 2_000_000_417))
""",
        """
import json, os
st = os.stat("/work")
print(json.dumps([os.listdir("/work"), oct(st.st_mode), os.stat("main.py").st_ino, os.listxattr("/work"),
                  st.st_atime < 2_000_000_000, st.st_mtime < 2_000_000_000]))
""",
    ),
    "hostname": (
        """
import ctypes, socket
libc = ctypes.CDLL(None)
for call in (socket.sethostname, lambda s: libc.setdomainname(s.encode(), len(s))):
    try:
        call("secret-417")
    except OSError:
        pass
""",
        """
import json, os, socket
print(json.dumps([socket.gethostname(), open("/proc/sys/kernel/domainname").read()]))
""",
    ),
    "proc_sys": (
        """
import os
for root, _, files in os.walk("/proc/sys"):
    for f in files:
        try:
            with open(os.path.join(root, f), "w") as fh:
                fh.write("417")
        except OSError:
            pass
""",
        """
import json, os
hits = []
for root, _, files in os.walk("/proc/sys"):
    for f in files:
        try:
            if open(os.path.join(root, f)).read().strip() == "417":
                hits.append(os.path.join(root, f))
        except OSError:
            pass
print(json.dumps(hits))
""",
    ),
    # device nodes are the host's inodes: their timestamps would carry bits to any later run
    "device_timestamps": (
        """
import os
for d in ("null", "zero", "random", "urandom"):
    try:
        os.utime(f"/dev/{d}", (2_000_000_417, 2_000_000_417))
    except OSError:
        pass
    try:
        os.utime(f"/dev/{d}")
    except OSError:
        pass
""",
        """
import json, os
print(json.dumps([os.stat(f"/dev/{d}").st_mtime_ns for d in ("null", "zero", "random", "urandom")]))
""",
    ),
    # anything writable outside /work (a /tmp, /dev/shm, /run) would outlive the run's tmpfs
    "writable_paths": (
        """
import os
for root, dirs, _ in os.walk("/"):
    if root.startswith(("/proc", "/work", "/usr")):  # /usr: a read-only bind, tested on its own
        dirs[:] = []
        continue
    try:
        open(os.path.join(root, ".secret-417"), "w").close()
    except OSError:
        pass
""",
        """
import json, os
found = []
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/usr")):
        dirs[:] = []
        continue
    found += [os.path.join(root, f) for f in files if "secret" in f]
print(json.dumps(found))
""",
    ),
    # a daemon holding a lock: killed with the run, so the lock cannot be seen held
    "file_lock": (
        """
import fcntl, os, time
fd = os.open("/usr/bin/python3", os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
if os.fork() == 0:
    os.setsid()
    time.sleep(300)
""",
        """
import fcntl, json, os
fd = os.open("/usr/bin/python3", os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print(json.dumps("free"))
except OSError as e:
    print(json.dumps(e.strerror))
""",
    ),
}


@pytest.fixture(scope="module")
def pool():
    """One worker, so every run of a test lands in the same container."""
    with SandboxPool(1) as p:
        p.map([{"files": {"main.py": "pass"}}])
        yield p


def _run(pool: SandboxPool, code: str):
    return pool.map([{"files": {"main.py": textwrap.dedent(code)}}], Limits(timeout_s=20))[0]


@pytest.mark.parametrize("kind", sorted(CHANNELS))
def test_a_run_cannot_pass_state_to_the_next(pool, kind):
    writer, reader = CHANNELS[kind]
    container = set(slot_processes())
    before = _run(pool, reader)
    assert before.exit_code == 0, before.stderr
    wrote = _run(pool, writer)
    assert wrote.exit_code == 0, wrote.stderr
    after = _run(pool, reader)
    assert after.exit_code == 0, after.stderr
    assert set(slot_processes()) == container, "the container was replaced: this test did not test reuse"
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert "417" not in after.stdout


def test_zygote_unshares_what_the_supervisor_filter_allows():
    """zygote.py imports nothing of the package: its copy of the namespace flags must match seccomp.py's."""
    tree = ast.parse((Path(seccomp.__file__).parent / "zygote.py").read_text())
    node = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id == "_RUN_NAMESPACES"
    )
    value = 0
    for c in ast.walk(node):
        if isinstance(c, ast.Constant):
            value |= c.value
    assert value == seccomp.RUN_NAMESPACES
