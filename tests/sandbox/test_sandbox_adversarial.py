"""Each claim of envs/sandbox's docstring, attacked: the program tries, the host checks it failed."""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from envs.sandbox import Limits, SandboxUnavailable, check_available
from envs.sandbox.core import slot_processes
from envs.sandbox.pool import SandboxPool
from tests.sandbox.conftest import leftover_slot_processes, sandbox_exec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sb():
    """One dedicated sandbox worker process (as the pool runs them)."""
    with SandboxPool(1) as pool:
        yield pool


def run(sb, code: str, **limits):
    return sb.map([{"files": {"main.py": textwrap.dedent(code)}}], Limits(**limits) if limits else None)[0]


def test_runs_code_and_reports(sb):
    r = run(sb, "import sys; print(6 * 7); print('err', file=sys.stderr); sys.exit(3)")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.stopped_reason) == (
        3,
        "42\n",
        "err\n",
        False,
        None,
    )


def test_cannot_read_files_outside_workdir(sb, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET-HOST-FILE")
    paths = [
        "/etc/passwd",
        "/etc/shadow",
        "/root",
        str(secret),
        str(ROOT / "pyproject.toml"),
        "/home",
        "/proc/1/root/etc/passwd",
        "/sys/kernel",
        "/var/log",
        "/tmp",
    ]
    r = run(
        sb,
        f"""
        import os
        ok = []
        for p in {paths!r}:
            try:
                if os.path.isdir(p):
                    ok.append((p, os.listdir(p)))
                else:
                    ok.append((p, open(p).read()[:40]))
            except OSError:
                pass
        print(repr(ok))
        print(sorted(os.listdir('/')))
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == "[]"
    assert "TOP-SECRET" not in r.stdout
    # the root holds the system's /usr (read-only) and the workdir; a pool worker's container also holds the
    # sandbox's own supervisor script (/.sandbox/zygote.py, read-only)
    root = set(ast.literal_eval(r.stdout.splitlines()[1])) - {".sandbox"}
    assert root == {"bin", "dev", "lib", "lib64", "proc", "sbin", "usr", "work"}


def test_cannot_write_outside_workdir(sb):
    r = run(
        sb,
        """
        import os
        wrote = []
        for p in ['/x', '/usr/x', '/usr/lib/x', '/dev/x', '/proc/x', '/bin/x']:
            try:
                open(p, 'w').write('x')
                wrote.append(p)
            except OSError:
                pass
        open('/work/ok', 'w').write('fine')
        print(wrote)
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_no_network_not_even_loopback(sb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted = []
    done = threading.Event()

    def serve():  # accepts until the program has ended (its connects time out after 2 s each)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(srv.accept())

    t = threading.Thread(target=serve)
    t.start()
    r = run(
        sb,
        f"""
        import socket
        results = {{}}
        for fam, addr in [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_INET6, ('::1', {port}))]:
            try:
                s = socket.socket(fam, socket.SOCK_STREAM)
                s.settimeout(2)
                s.connect(addr)
                results[str(fam)] = 'connected'
            except OSError as e:
                results[str(fam)] = type(e).__name__
        try:
            socket.getaddrinfo('example.com', 80)
            results['dns'] = 'resolved'
        except OSError as e:
            results['dns'] = 'failed'
        a, b = socket.socketpair()  # AF_UNIX stays usable for the program itself
        a.send(b'x'); results['unix'] = b.recv(1).decode()
        print(results)
    """,
    )
    done.set()
    t.join()
    srv.close()
    assert r.exit_code == 0, r.stderr
    assert "connected" not in r.stdout and "resolved" not in r.stdout
    assert "'unix': 'x'" in r.stdout
    assert accepted == []


def test_fork_bomb_is_contained(sb):
    run(sb, "pass")
    container = set(slot_processes())  # the worker's container (bubblewrap and the supervisor)
    t0 = time.monotonic()
    r = run(
        sb,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
        timeout_s=4,
    )
    assert time.monotonic() - t0 < 15
    assert r.timed_out and r.stopped_reason == "timeout"
    assert leftover_slot_processes(before=container) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_memory_bomb_is_stopped(sb):
    r = run(sb, "x = bytearray(8 * 1024**3)", memory_mb=256)
    assert r.exit_code != 0 and r.stopped_reason == "memory"
    # many small allocations (no single huge request) hit the limit too
    r = run(sb, "x = []\nwhile True: x.append(b'y' * 1_000_000)", memory_mb=256, timeout_s=20)
    assert r.exit_code != 0 and r.stopped_reason == "memory", (r.stopped_reason, r.stderr[-300:])


def test_cpu_loop_is_killed_at_the_timeout(sb):
    t0 = time.monotonic()
    r = run(sb, "while True: pass", timeout_s=1.5)
    assert r.timed_out and r.exit_code is None and r.stopped_reason == "timeout"
    assert time.monotonic() - t0 < 5


def test_cpu_limit_below_timeout(sb):
    r = run(sb, "while True: pass", timeout_s=20, cpu_s=1)
    assert not r.timed_out and r.stopped_reason == "cpu", r


def test_disk_fill_is_capped(sb):
    r = run(
        sb,
        """
        import os
        n = 0
        try:
            with open('/work/big', 'wb') as f:
                for _ in range(1024):
                    f.write(b'0' * 1024 * 1024)
                    f.flush()
                    n += 1
        except OSError as e:
            print('stopped', e.errno)
        print(n)
        try:
            open('/fill', 'wb').write(b'0' * 1024 * 1024)
            print('root writable')
        except OSError:
            print('root read-only')
    """,
        disk_mb=16,
    )
    lines = r.stdout.split()
    assert "stopped" in r.stdout or r.stopped_reason is not None
    assert int(r.stdout.splitlines()[-2]) <= 16
    assert lines[-1] == "read-only"


def test_cannot_signal_host_processes(sb):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = run(
            sb,
            f"""
            import os, signal
            hits = []
            for pid in [{victim.pid}, {os.getpid()}, 1, 2, 3] + list(range(4, 400)):
                if pid in (os.getpid(), os.getppid()):  # itself and its supervisor (tested on their own)
                    continue
                try:
                    os.kill(pid, signal.SIGKILL if pid > 2 else 0)
                    hits.append(pid)
                except OSError:
                    pass
            print(hits)
        """,
        )
        time.sleep(0.2)
        assert victim.poll() is None, "a host process was killed from inside the sandbox"
        hits = ast.literal_eval(r.stdout.strip())  # only the sandbox's own pid-namespace processes answer
        assert victim.pid not in hits or victim.pid < 4
        assert os.getpid() not in hits or os.getpid() < 4
    finally:
        victim.kill()


def test_host_environment_is_invisible(sb, monkeypatch):
    monkeypatch.setenv("RLF_HOST_SECRET", "hunter2-env-secret")
    r = run(
        sb,
        """
        import os, glob
        print(dict(os.environ))
        for p in glob.glob('/proc/*/environ'):
            try:
                print(open(p, 'rb').read())
            except OSError:
                pass
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert "hunter2" not in r.stdout
    assert "AWS_" not in r.stdout and "PREFECT" not in r.stdout


def test_proc_shows_only_the_sandbox(sb):
    r = run(
        sb,
        """
        import os
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        cmds = [open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode() for p in pids]
        print(len(pids)); print(cmds)
        try:
            print(open('/proc/1/root/etc/hostname').read())
        except OSError as e:
            print('no host root')
    """,
    )
    n, cmds = int(r.stdout.splitlines()[0]), r.stdout.splitlines()[1]
    assert n <= 3, r.stdout  # bwrap's init, the program (and nothing of the host)
    assert "pytest" not in cmds and "sleep" not in cmds


def test_symlink_tricks(sb, tmp_path):
    secret = tmp_path / "s.txt"
    secret.write_text("SYMLINK-SECRET")
    r = run(
        sb,
        f"""
        import os
        got = []
        targets = ['{secret}', '/etc/passwd', '/proc/1/root{secret}', '/proc/self/root/../../{secret}']
        for i, target in enumerate(targets):
            os.symlink(target, f'/work/l{{i}}')
            try:
                got.append(open(f'/work/l{{i}}').read())
            except OSError:
                pass
        print(got)
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == "[]"
    for bad in ("../escape.py", "/etc/x", "a/../../b", ""):
        with pytest.raises(ValueError, match="relative path"):
            sb.map([{"files": {bad: "print(1)"}}])


def test_huge_output_is_capped(sb):
    r = run(
        sb,
        "import sys\nwhile True: sys.stdout.write('x' * 65536); sys.stderr.write('e' * 4096)",
        output_bytes=65536,
    )
    assert len(r.stdout.encode()) == 65536 and r.stdout_truncated
    assert len(r.stderr.encode()) <= 65536
    assert r.stopped_reason == "output_limit"


def test_no_process_left_behind(sb):
    run(sb, "pass")
    container = set(slot_processes())
    workers = {
        w: set((w / "cgroup.procs").read_text().split())
        for w in Path("/sys/fs/cgroup").rglob("rlfoundry-sandbox/worker-*")
    }
    before = (
        set(Path("/sys/fs/cgroup").rglob("rlfoundry-sandbox/run-*"))
        if Path("/sys/fs/cgroup").exists()
        else set()
    )
    r = run(
        sb,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)  # a daemon that outlives the program
            os._exit(0)
        print('parent exits')
    """,
    )
    assert r.exit_code == 0 and "parent exits" in r.stdout
    time.sleep(0.3)
    assert leftover_slot_processes(before=container) == []
    after = set(Path("/sys/fs/cgroup").rglob("rlfoundry-sandbox/run-*"))
    assert after <= before  # no per-run cgroup left
    for worker, procs in workers.items():
        left = set((worker / "cgroup.procs").read_text().split()) - procs
        assert not left, f"{worker} still holds {left}: only the worker and its container may remain"


def test_seccomp_refuses_kernel_attack_surface(sb):
    """Each call fails with EPERM from the filter (the status line says a filter is on); mount, bpf and keyctl
    fail without seccomp too, so the errno and the Seccomp line are what show the filter refused them."""
    r = run(
        sb,
        """
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        def call(fn, *args):
            ret = fn(*args)
            return [ret, ctypes.get_errno() if ret == -1 else 0]
        out = {
            "ptrace": call(libc.ptrace, 0, 0, 0, 0),                      # PTRACE_TRACEME
            "unshare_user": call(libc.unshare, 0x10000000),               # CLONE_NEWUSER
            "clone_newuser": call(libc.syscall, 56, 0x10000000 | 17, 0, 0, 0, 0),  # clone(NEWUSER | SIGCHLD)
            "mount": call(libc.mount, b"none", b"/work", b"tmpfs", 0, None),
            "bpf": call(libc.syscall, 321, 0, 0, 0),
            "keyctl": call(libc.syscall, 250, 0, 0, 0),
            "socket_inet": call(libc.socket, 2, 1, 0),
        }
        if out["clone_newuser"][0] == 0:
            libc._exit(0)  # the child of a clone that should not have happened
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        out["seccomp_mode"] = int(status["Seccomp"])
        print(json.dumps(out))
    """,
    )
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out.pop("seccomp_mode") == 2, "no seccomp filter on the run"  # SECCOMP_MODE_FILTER
    assert out.pop("socket_inet") == [-1, errno.EAFNOSUPPORT]
    assert out == dict.fromkeys(out, [-1, errno.EPERM]), out


def test_seccomp_refuses_an_unknown_syscall_name():
    """A deny rule is never dropped silently: a name libseccomp cannot resolve stops the filter build."""
    from envs.sandbox import seccomp

    with pytest.raises(SandboxUnavailable, match="no_such_syscall"):
        seccomp._compile([*seccomp.DENIED, "no_such_syscall"], supervisor=False)
    assert all(seccomp.resolve(n) is not None for n in seccomp.DENIED if n not in seccomp.ARCH_OPTIONAL)


def test_refuses_when_a_mechanism_is_missing(monkeypatch):
    check = check_available.__wrapped__
    with pytest.raises(SandboxUnavailable, match="unknown sandbox mode"):
        check("none")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        check("strict")
    monkeypatch.undo()
    monkeypatch.setattr("envs.sandbox.cgroup.CG_ROOT", Path("/nonexistent-cgroup-root"))
    with pytest.raises(SandboxUnavailable, match="RLFOUNDRY_SANDBOX_MODE=rlimits"):
        check("strict")
    check("rlimits")  # the weaker mode is there when named explicitly


def test_cli_sandbox_exec(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import sys\nprint('hi')\nsys.stdout.write('z' * 200000)\n")
    r = sandbox_exec(prog, "--timeout", "5", "--memory-mb", "256")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["exit_code"] == 0 and out["timed_out"] is False and out["stdout"].startswith("hi\n")
    assert len(out["stdout"]) == 65536 and out["stdout_truncated"] is True
    assert set(out) >= {"exit_code", "timed_out", "stdout", "stderr", "stopped_reason"}
    loop = tmp_path / "loop.py"
    loop.write_text("while True: pass\n")
    r = sandbox_exec(loop, "--timeout", "1")
    out = json.loads(r.stdout)
    assert out["timed_out"] is True and out["stopped_reason"] == "timeout"


# -- the pool's long-lived containers (Sandbox(reuse=True)): runs must not see or touch each other ----------
def test_a_run_sees_nothing_of_the_previous_one(sb):
    r = run(
        sb,
        """
        import os, subprocess
        os.makedirs('d/e', exist_ok=True)
        open('d/e/left.txt', 'w').write('secret of run 1')
        os.symlink('/work/d', 'link')
        os.chmod('d/e', 0)  # a directory its own owner cannot list
        subprocess.Popen(['sleep', '300'])
        print('done')
    """,
    )
    assert r.exit_code == 0, r.stderr
    r = run(
        sb,
        """
        import os
        print(sorted(os.listdir('.')))
        print([p for p in os.listdir('/proc')
               if p.isdigit() and 'sleep' in open(f'/proc/{p}/cmdline').read()])
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["['main.py']", "[]"]


def test_a_run_cannot_read_or_steer_its_supervisor(sb):
    r = run(
        sb,
        """
        import os, resource
        sup = os.getppid()
        out = {}
        for what in ('mem', 'environ', 'fd/3', 'fd/0', 'maps', 'root/work'):
            try:
                with open(f'/proc/{sup}/{what}', 'rb') as f:
                    f.read(1)
                out[what] = 'READ'
            except OSError as e:
                out[what] = type(e).__name__
        try:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            out['raise_limit'] = 'RAISED'
        except (ValueError, OSError):
            out['raise_limit'] = 'refused'
        print(out)
    """,
    )
    assert r.exit_code == 0, r.stderr
    assert "READ" not in r.stdout and "RAISED" not in r.stdout, r.stdout


@pytest.mark.parametrize(
    "attack",
    [
        "os.kill(os.getppid(), 9)",  # its parent is the run's own init, which ignores signals from inside
        "try:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n    pass",  # all it may signal: only itself
        "os.kill(os.getppid(), signal.SIGSTOP)",
        "os.kill(1, signal.SIGTERM)",
        "os.chmod('/work', 0)",  # harmless to this run; the next one gets a new /work
    ],
)
def test_a_run_cannot_reach_its_container(sb, attack):
    """The supervisor is outside the run's pid namespace: a run cannot kill or stop it, and the next run
    finds the same container working."""
    run(sb, "pass")
    container = set(slot_processes())
    r = run(sb, f"import os, signal\n{attack}\nprint('after')", timeout_s=3)
    assert (r.exit_code, r.stopped_reason, r.stdout) == (0, None, "after\n"), r
    nxt = run(sb, "import os; print(sorted(os.listdir('.')), 6 * 7)")
    assert (nxt.exit_code, nxt.stdout) == (0, "['main.py'] 42\n"), nxt
    assert set(slot_processes()) == container, "the container was replaced"
