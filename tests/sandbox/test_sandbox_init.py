"""A fresh container's pid 1 (envs/sandbox/init.py), attacked from the program it starts: it must hold nothing
the program may not read (the stdin a harness hides from the code it tests), take no write into its memory,
ignore the program's signals, report the program's own status, and leave nothing behind.

Every attack runs in both fresh modes (``Sandbox("strict")``, ``Sandbox("rlimits")``: what ``rlfoundry
sandbox exec``, ``SandboxPool(reuse=False)`` and every pool under ``RLFOUNDRY_SANDBOX_MODE=rlimits`` use) and
in a reused pool container, whose runs have the supervisor's init as pid 1."""

from __future__ import annotations

import ast
import textwrap
import time

import pytest

from envs.sandbox import Limits, Sandbox
from envs.sandbox.core import slot_processes
from envs.sandbox.pool import SandboxPool
from tests.sandbox.conftest import leftover_slot_processes

SECRET = "hidden-tests-and-nonce-7f3a91"
MODES = ["fresh_strict", "fresh_rlimits", "reused"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(1) as p:
        yield p


def run(kind: str, pool: SandboxPool, code: str, stdin: bytes = b"", **limits):
    files = {"main.py": textwrap.dedent(code)}
    lim = Limits(**limits) if limits else None
    if kind == "reused":
        return pool.map([{"files": files, "stdin": stdin}], lim)[0]
    return Sandbox(kind.removeprefix("fresh_")).run(files, stdin=stdin, limits=lim)  # type: ignore[arg-type]


# The program closes its own stdin, then looks for it in every other process and every fd it can name.
LOOK_FOR_STDIN = """
    import os
    os.close(0)
    found, tried = [], {}
    for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
        for what in ('mem', 'syscall', 'environ', 'maps', 'fd'):
            try:
                if what == 'fd':
                    names = os.listdir(f'/proc/{pid}/fd')
                    for fd in names:
                        with open(f'/proc/{pid}/fd/{fd}', 'rb') as f:
                            found.append(f.read(4096))
                else:
                    with open(f'/proc/{pid}/{what}', 'r+b' if what == 'mem' else 'rb') as f:
                        f.read(64)
                tried[f'{pid}/{what}'] = 'OPENED'
            except OSError as e:
                tried[f'{pid}/{what}'] = type(e).__name__
    print(repr(tried))
    print(repr(found))
"""


@pytest.mark.parametrize("kind", MODES)
def test_a_run_cannot_read_its_closed_stdin_or_open_its_init(kind, pool):
    r = run(kind, pool, LOOK_FOR_STDIN, stdin=SECRET.encode())
    assert r.exit_code == 0, r.stderr
    tried = ast.literal_eval(r.stdout.splitlines()[0])
    assert "1/mem" in tried, tried  # pid 1 (the init) is in its namespace and was tried
    assert "OPENED" not in tried.values(), tried
    assert SECRET not in r.stdout and SECRET not in r.stderr


@pytest.mark.parametrize("kind", MODES)
def test_the_init_ignores_the_program_and_reports_its_status(kind, pool):
    code = """
        import os, signal
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGKILL):
            try:
                os.kill(1, sig)
            except OSError:
                pass
        print('still here', flush=True)
        os._exit(3)
    """
    r = run(kind, pool, code, timeout_s=5)
    assert (r.exit_code, r.stdout, r.stopped_reason) == (3, "still here\n", None), r
    r = run(kind, pool, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", timeout_s=5)
    assert r.stopped_reason == "signal:SIGSEGV", r


@pytest.mark.parametrize("kind", ["fresh_strict", "fresh_rlimits"])
def test_a_daemon_that_drops_its_parent_death_signal_dies_with_the_run(kind, pool):
    before = set(slot_processes())
    code = """
        import ctypes, os, signal, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
                for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_IGN)
                time.sleep(300)
            os._exit(0)
        time.sleep(0.2)
        print('program exits')
    """
    r = run(kind, pool, code, timeout_s=5)
    assert (r.exit_code, r.stdout) == (0, "program exits\n"), r
    assert leftover_slot_processes(before=before) == []
    # the same daemon from a program that runs into its timeout
    r = run(kind, pool, code.replace("print('program exits')", "time.sleep(60)"), timeout_s=1)
    assert r.stopped_reason == "timeout", r
    time.sleep(0.2)
    assert leftover_slot_processes(before=before) == []


def test_a_program_that_cannot_be_started_is_named(pool):
    r = Sandbox("strict").run({"main.py": ""}, ["/usr/bin/no-such-program", "x"], limits=Limits(timeout_s=5))
    assert r.exit_code == 127 and "cannot execute /usr/bin/no-such-program" in r.stderr, r


# A completion that answers each hidden test from the expected values on its init's stdin (the layout
# envs/code/run.py's harness reads: nonce, entry, budget, n, n inputs, n expected values).
LEAK = """\
    import ast
    try:
        lines = open('/proc/1/fd/0').read().split('\\n')
    except OSError:
        return None
    n = int(lines[3])
    inputs, expected = lines[4 : 4 + n], lines[4 + n : 4 + 2 * n]
    key = repr(tuple([x]))
    return ast.literal_eval(expected[inputs.index(key)]) if key in inputs else None
"""


@pytest.mark.parametrize("mode", ["strict", "rlimits"])
def test_a_completion_cannot_answer_from_the_hidden_tests(mode, monkeypatch):
    """End to end through the code environment's grader: under ``rlimits`` its pool runs fresh containers."""
    import random

    from envs.code import CodeConfig
    from envs.code.run import close_pools, run_candidates
    from envs.code.tasks import draw_task
    from envs.sandbox.limits import MODE_ENV

    monkeypatch.setenv(MODE_ENV, mode)
    task = draw_task(random.Random(1), ["affine"], 5, 99)
    cfg = CodeConfig(templates=["affine"], workers=1)
    try:
        leak, honest = run_candidates([(task, LEAK), (task, task["answer"])], cfg)
    finally:
        close_pools()
    assert (honest["correct"], honest["infra_error"]) == (True, None), honest
    assert (leak["correct"], leak["tests_passed"], leak["infra_error"]) == (False, 0.0, None), leak
