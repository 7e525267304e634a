"""Shared fixtures: every test gets its own state dir (store, MLflow DB, Prefect home).

Tests outside tests/unit share one Prefect server for the session (``prefect_api``, requested by the autouse
fixtures of tests/integration/conftest.py and tests/sandbox/conftest.py); unit tests start no server."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tenacity

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# OpenMP threads that wait passively instead of spinning, in this process and every process the suite starts
# (set before torch loads its OpenMP runtime, which reads it once): on two cores shared by two workers' runs,
# servers and ranks, spinning threads took the CPU their peers needed — three smoke runs at once took 60 s
# spinning, 34 s passive, with the same policy hashes (the same threads compute the same sums).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# `make test` runs two pytest-xdist workers (`-n 2 --dist loadgroup`) over everything but tests/sandbox
# (those count every sandbox process on the machine, so they run alone afterwards): most of the suite waits
# on servers and subprocesses. Each test module is one group (its module-scoped fixtures run once); modules
# that share something machine-wide share a group, so they never run at the same time: SeaweedFS opens fixed
# ports (8181, 9101) besides the ones it is given. The asynchronous half of the crash matrix has its own
# reference run, so it is a group of its own.
SHARED_GROUPS = {
    "tests/sandbox/": "sandbox",
    "tests/integration/test_s3_store.py": "s3",
    "tests/integration/test_run_ids.py": "s3",
    "tests/integration/test_stack.py": "s3",
}
SPLIT_GROUPS = {"tests/integration/test_resume.py": ("test_killed_async_run", "async")}
# Modules whose every test is a group of its own: the benchmark smokes (each has its own state dir; together
# they are minutes of work, spread over both workers).
PER_TEST_GROUPS = ("tests/integration/test_benchmarks_smoke.py",)
# The groups run longest first (`--no-loadscope-reorder` keeps this order), so that no long group starts
# last while the other worker idles: each group's seconds as measured (tests/durations.json, written by
# `make test-profile`); a group not measured yet counts as DEFAULT_GROUP_S.
DURATIONS = Path(__file__).with_name("durations.json")
DEFAULT_GROUP_S = 30.0


def group_of(path: str, name: str) -> str:
    """The group test ``name`` of module ``path`` (relative to the checkout) runs in: its module, a shared
    group, or a split-off part of its module.

    >>> group_of("tests/sandbox/test_x.py", "test_a"), group_of("tests/unit/test_y.py", "test_b[1]")
    ('sandbox', 'tests/unit/test_y.py')
    >>> group_of("tests/integration/test_resume.py", "test_killed_async_run_resumes[x]")
    'tests/integration/test_resume.py:async'
    >>> group_of("tests/integration/test_benchmarks_smoke.py", "test_benchmark_smoke[rollout]")
    'tests/integration/test_benchmarks_smoke.py:test_benchmark_smoke[rollout]'
    """
    if path in PER_TEST_GROUPS:
        return f"{path}:{name}"
    group = next((g for prefix, g in SHARED_GROUPS.items() if path.startswith(prefix)), path)
    split = SPLIT_GROUPS.get(path)
    if split and name.startswith(split[0]):
        group = f"{path}:{split[1]}"
    return group


def xdist_group(item: pytest.Item) -> str:
    return group_of(Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix(), item.name)


# tryfirst: xdist's own hook turns the xdist_group marks into the scheduler's groups; run after it, the marks
# came too late and every test was a group of its own (a module's fixtures then ran on both workers).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    groups = {id(item): xdist_group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)]))
    items.sort(key=lambda item: -seconds.get(groups[id(item)], DEFAULT_GROUP_S))  # stable: module order kept


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(d))
    monkeypatch.setenv("PREFECT_HOME", str(d / "prefect"))
    return d


_API: dict[str, str] = {}


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's Prefect home and state dir, under pytest's temp dir: no test writes to the project's
    .state. Starts nothing."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["RLFOUNDRY_STATE_DIR"] = str(home / "state")
    return home


@pytest.fixture(scope="session")
def prefect_api(session_home: Path):
    """One Prefect API server for the whole session (127.0.0.1, UI on for the browser test), shared by every
    `rlfoundry` subprocess; it dies with pytest however pytest ends."""
    from infra.localstack import prefect_server
    from rl_core.artifacts.paths import free_port

    home = session_home
    port = free_port()
    # (without the services that only feed a UI: no test reads task runs, and on 2 cores they took ~0.15 CPU
    # seconds per iteration beside every run of the session: benchmarks/prefect_server.py)
    srv = prefect_server.start(port, home, home / "server.log", ui=True, tie_to_parent=True, lean=True)
    try:
        srv.wait_http(prefect_server.health_url(port), timeout_s=120)
        _API["url"] = f"http://127.0.0.1:{port}/api"
        yield _API["url"]
    finally:
        _API.pop("url", None)
        srv.stop(timeout_s=10)


def prefect_api_if_slow(request: pytest.FixtureRequest) -> str | None:
    """The session's Prefect server for a session with a test marked slow; None when none is selected
    (`make test-fast`: nothing there starts a server or an `rlfoundry run`). The session-scoped autouse
    fixtures of tests/integration and tests/sandbox call it, so the server is up before any module fixture's
    runs."""
    if not any(item.get_closest_marker("slow") for item in request.session.items):
        return None
    return request.getfixturevalue("prefect_api")


def committed_stages(shown: dict) -> set[tuple[int, str]]:
    """(iteration, stage) of every committed stage in a ``show --json`` report."""
    return {
        (it["iteration"], st)
        for it in shown["iterations"]
        for st, v in it["stages"].items()
        if v["status"] == "committed"
    }


def quiet_cron(now: dt.datetime | None = None) -> str:
    """A daily cron that fires 12 hours from ``now`` (UTC): a deployment served by a test never meets its
    own schedule, whatever the time of day the suite runs (a fixed "0 3 * * *" fired the sweep inside a
    test run at 03:00).

    >>> quiet_cron(dt.datetime(2026, 12, 5, 2, 59, tzinfo=dt.UTC))
    '59 14 * * *'
    >>> quiet_cron(dt.datetime(2026, 1, 1, 15, 0, tzinfo=dt.UTC))
    '0 3 * * *'

    """
    at = (now or dt.datetime.now(dt.UTC)) + dt.timedelta(hours=12)
    return f"{at.minute} {at.hour} * * *"


def cli_env(state: Path) -> dict[str, str]:
    """Environment for a `rlfoundry` subprocess writing under ``state``, on the session's Prefect server."""
    env = dict(os.environ)
    env.update(RLFOUNDRY_STATE_DIR=str(state), TQDM_DISABLE="1")
    # A served flow's runner and a pool's worker look for scheduled runs every 10 s by default: ~12 s of
    # waiting per flow run the tests trigger (the suite budget). Every 2 s here; users keep Prefect's default.
    env.update(PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_WORKER_QUERY_SECONDS="2")
    # The runs' INFO lines (stages, iterations) go to the Prefect server only where a test reads them (the
    # served flows: ``serving``); elsewhere the session's one server gets warnings and alarms, as before.
    # (assigned: this process's own import of flows set the INFO default in os.environ)
    env["PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL"] = "WARNING"
    env["PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL"] = "WARNING"
    if "url" in _API:
        env["PREFECT_API_URL"] = _API["url"]
    return env


_FORK: dict[str, object] = {}


def _fork_server() -> object:
    """This pytest process's fork server (tests/forkserver.py), started on first use, gone with it."""
    if "server" not in _FORK:
        import atexit
        import shutil
        import tempfile

        from tests.forkserver import ForkServer

        work = Path(tempfile.mkdtemp(prefix="rlf-forkserver-"))
        server = ForkServer(work)
        server.start()

        def stop() -> None:
            if server.proc is not None:
                server.proc.kill()
                server.proc.wait()
            shutil.rmtree(work, ignore_errors=True)

        atexit.register(stop)
        _FORK["server"] = server
    return _FORK["server"]


# nanobind's report at interpreter exit of the triton bindings' objects still alive (triton comes with vLLM
# and torch): some 80 lines on every command's stderr, enough to push a failure's cause out of the tail an
# assertion message shows (it did in CI). Dropped from what the helpers below return, replaced by one line.
_EXIT_NOISE = re.compile(
    r"^(nanobind: .*|\s+- (leaked (instance|type|function) .*|\.\.\. skipped remainder)|See https://nanobind\S*)\n",
    re.M,
)


def _quiet(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``r`` with nanobind's exit-time leak report left out of its stderr (``_EXIT_NOISE``)."""
    if isinstance(r.stderr, str) and "nanobind: " in r.stderr:
        dropped = "(nanobind's exit-time leak report dropped: tests/conftest.py)\n"
        r.stderr = _EXIT_NOISE.sub("", r.stderr) + dropped
    return r


def cli(
    args: list[str], env: dict[str, str], timeout: float = 900, fresh: bool = False, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """``rlfoundry ARGS`` in a process of its own with exactly ``env`` (in ``cwd``), output captured: a child
    of the fork server (tests/forkserver.py: the heavy imports done once), or with ``fresh`` (or
    RLFOUNDRY_TEST_FORK=0) a new interpreter, ``python -m flows.cli``."""
    if not fresh and os.environ.get("RLFOUNDRY_TEST_FORK", "1") != "0":
        return _quiet(_fork_server().run(args, env, timeout, cwd=cwd))  # type: ignore[attr-defined]
    return _quiet(
        subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    )


def python_in_private_netns(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -c CODE`` in a network namespace of its own (loopback only), from the project root: for a
    local Ray cluster, whose servers listen on every interface of the node whatever address they are given."""
    return subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"']
        + [sys.executable, code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )


def run_script(
    script: str, args: list[str], env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` (SCRIPT relative to the checkout), a child of the fork server like ``cli``."""
    if os.environ.get("RLFOUNDRY_TEST_FORK", "1") != "0":
        return _quiet(_fork_server().run(args, env, timeout, script=script))  # type: ignore[attr-defined]
    argv = [sys.executable, script, *args]
    return _quiet(subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout))


def run_cli(
    args: list[str],
    state: Path,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """``rlfoundry ARGS`` writing under ``state`` (see ``cli_env``; ``env`` added), output captured."""
    return cli(args, {**cli_env(state), **(env or {})}, timeout, fresh)


def show_json(state: Path, run_id: str, store: str | None = None) -> dict:
    """``rlfoundry show RUN_ID --json`` writing under ``state``, run in this process through typer's
    CliRunner: the command's own code, without the ~10 s of a new interpreter importing torch (a test whose
    subject is the command as a program runs it with ``run_cli``)."""
    from typer.testing import CliRunner

    from flows.cli import app

    args = ["show", run_id, "--json", *(["--store", store] if store else [])]
    r = CliRunner().invoke(app, args, env=cli_env(state))
    assert r.exit_code == 0, (r.exit_code, r.output[-2000:], r.exception)
    return json.loads(r.stdout)


def replay_cli(
    state: Path, run_id: str, iteration: int, stages: list[str], timeout: float = 600
) -> subprocess.CompletedProcess:
    """``rlfoundry replay RUN_ID --iteration K --stage S1 --stage S2 ... --json``: one process for several
    stages (the engines start once)."""
    args = ["replay", run_id, "--iteration", str(iteration), *(a for s in stages for a in ("--stage", s))]
    return run_cli([*args, "--json"], state, timeout=timeout)


def replayed_identical(state: Path, run_id: str, iteration: int, stages: list[str]) -> dict:
    """The replay reports of ``stages`` (by stage), each asserted identical to the stored outputs."""
    r = replay_cli(state, run_id, iteration, stages)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(r.stdout)
    reports = data["stages"] if len(stages) > 1 else {stages[0]: data}
    for stage, report in reports.items():
        assert report["identical"] is True, (stage, report)
    assert list(reports) == list(dict.fromkeys(stages))
    return reports


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, urllib.error.HTTPError) and exc.code in (429, 502, 503)


@tenacity.retry(
    retry=tenacity.retry_if_exception(_retryable),
    wait=tenacity.wait_exponential(multiplier=0.5, max=8),
    stop=tenacity.stop_after_attempt(8),
    reraise=True,
)
def prefect_api_call(url: str, body: object = None, method: str | None = None) -> object:
    """One call of Prefect's REST API (GET without a body, POST with one), the JSON answer or None.

    Retried, as Prefect's own client does, on the answers its server gives for a retryable failure (503 for
    SQLite's 'database is locked' while another writer holds the file, 429, 502)."""
    data = None if body is None else json.dumps(body).encode()
    method = method or ("GET" if data is None else "POST")
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


DEPLOYMENTS = ("experiment", "evaluation-sweep", "replay")


def _delete_deployments(api: str) -> None:
    found = prefect_api_call(
        f"{api}/deployments/filter", {"deployments": {"name": {"any_": list(DEPLOYMENTS)}}}
    )
    for d in found:
        prefect_api_call(f"{api}/deployments/{d['id']}", method="DELETE")


@contextlib.contextmanager
def serving(state: Path, args: list[str], log: Path) -> Iterator[dict[str, dict]]:
    """``rlfoundry serve ARGS`` writing under ``state``, on the session's Prefect server; yields the three
    deployments by name once this process registered them. Deployments left by an earlier test are deleted
    first (else they would be found before ours are registered), and ours when it stops (else their schedules
    keep firing)."""
    env = cli_env(state)
    env |= {
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    }
    api = env["PREFECT_API_URL"]
    _delete_deployments(api)
    out = open(log, "wb")  # noqa: SIM115 (closed below, after the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", *args],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        deps: dict[str, dict] = {}
        while len(deps) < len(DEPLOYMENTS):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "deployments not registered in 180 s"
            found = prefect_api_call(
                f"{api}/deployments/filter", {"deployments": {"name": {"any_": list(DEPLOYMENTS)}}}
            )
            deps = {d["name"]: d for d in found}
            time.sleep(1)
        yield deps
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        out.close()
        _delete_deployments(api)


ENGINE_PROMPTS = ["12+34=", "7-9=", "55+5=", "3+4=", "81-19=", "40+2="]


def two_policies(folder: Path, max_position: int = 64) -> tuple[object, Path, Path]:
    """Two different random tiny policies with one tokenizer, saved as checkpoint folders ``A`` (an engine
    starts on it) and ``B`` (synced in later); returns (tokenizer, A, B)."""
    from rl_core.models.model import build_model, build_tokenizer, save_checkpoint
    from rl_core.schema.config import ModelSection

    tok = build_tokenizer([*ENGINE_PROMPTS] + [str(i) for i in range(200)], 64)
    cfg = ModelSection(
        hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position=max_position
    )
    save_checkpoint(build_model(cfg, tok, seed=1), tok, folder / "A")
    save_checkpoint(build_model(cfg, tok, seed=2), tok, folder / "B")
    return tok, folder / "A", folder / "B"


S3_KEY, S3_SECRET = "rlf-test-key", "rlf-test-secret-d1e4f0c9a7"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 server (SeaweedFS on 127.0.0.1) for one test module, with the bucket ``rlf-test``; yields the
    environment that points clients at it (also set in this process while the module runs)."""
    from infra.localstack.s3_server import S3Server

    srv = S3Server.start(tmp_path_factory.mktemp("weed"), access_key=S3_KEY, secret_key=S3_SECRET)
    env = {
        "AWS_ENDPOINT_URL": srv.endpoint,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("rlf-test")
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    srv.stop()


# -- servers' logs: a test fails when a server it talks to logs an error or a traceback while it runs --------
# Every server the suite starts (the session's Prefect server, `rlfoundry up`'s S3/Prefect/MLflow, a run's
# private Prefect server, the S3 fixture's SeaweedFS) writes its log under pytest's base temp dir with one of
# these names, so a broken background service (a scheduler failing every loop) cannot hide behind a passing
# request. A test that provokes a server error on purpose says which with @pytest.mark.server_log_allows(RE).
SERVER_LOG_NAMES = ("server.log", "prefect.log", "mlflow.log", "weed.log")
ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)"  # Python
    r"|\b(?:ERROR|CRITICAL|FATAL)\b"  # Python logging, uvicorn, gunicorn
    r"|^[EF]\d{4} \d\d:\d\d:\d\d"  # glog (SeaweedFS): E = error, F = fatal
)


def server_logs(base: Path) -> list[Path]:
    return [
        p
        for p in base.rglob("*.log")
        if p.is_file() and (p.name in SERVER_LOG_NAMES or p.name.startswith("prefect-server-"))
    ]


def log_errors(text: str) -> list[str]:
    """The error entries of a log excerpt: each flagged line, a traceback with everything up to its exception.

    >>> log_errors("INFO ok\\nTraceback (most recent call last):\\n  File x\\nValueError: bad\\nINFO fine")
    ['Traceback (most recent call last):\\n  File x\\nValueError: bad']
    >>> log_errors("I1130 12:00:00.1 master.go ok\\nE1130 12:00:01.2 volume.go: disk full")
    ['E1130 12:00:01.2 volume.go: disk full']

    A logger.exception() entry is its message line and the traceback under it, one entry (so that an allowance
    matching the exception covers the message too):

    >>> log_errors("12:07 | ERROR | failed\\nTraceback (most recent call last):\\n  File y\\nOSError: locked")
    ['12:07 | ERROR | failed\\nTraceback (most recent call last):\\n  File y\\nOSError: locked']
    """
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if not ERROR_LINE.search(lines[i]):
            i += 1
            continue
        j = i + 1
        if not lines[i].startswith("Traceback") and j < len(lines) and lines[j].startswith("Traceback"):
            j += 1  # the message of a logger.exception(): its traceback follows
        if lines[j - 1].startswith("Traceback"):
            while j < len(lines) and (lines[j][:1].isspace() or not lines[j].strip()):
                j += 1
            j += 1  # the exception's own line
        out.append("\n".join(lines[i:j]))
        i = j
    return out


@pytest.fixture(autouse=True)
def server_logs_clean(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.getbasetemp()
    before = {p: p.stat().st_size for p in server_logs(base)}
    yield
    allowed = [re.compile(m.args[0]) for m in request.node.iter_markers("server_log_allows")]
    problems = []
    for p in server_logs(base):
        with open(p, "rb") as f:
            f.seek(before.get(p, 0))
            text = f.read().decode(errors="replace")
        problems += [f"{p}:\n{e}" for e in log_errors(text) if not any(a.search(e) for a in allowed)]
    if problems:
        pytest.fail("a server logged errors during this test:\n" + "\n".join(problems[:10]), pytrace=False)


# -- nothing written into the checkout: the suite writes only under pytest's temp dirs ---------------------
# The files git would list (untracked, or ignored like .state/) are read when the session starts and when it
# ends, in the controlling process (with xdist, after every worker finished); a file a test left in the
# repository fails the session, naming it. Caches of the tools themselves are not the tests' writing.
_TOOL_CACHES = ("__pycache__/", ".pytest_cache/", ".ruff_cache/", ".venv/", ".egg-info/", "test-reports/")


def _written_files() -> set[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # not a git checkout (an sdist): nothing to compare
        return set()
    paths = {line[3:] for line in out.stdout.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not any(c in f"/{p}" for c in _TOOL_CACHES)}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        session.config._rlf_files_before = _written_files()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = getattr(session.config, "_rlf_files_before", None)
    if before is None:
        return
    new = sorted(_written_files() - before)
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "tests wrote into the repository (write under tmp_path instead):\n  " + "\n  ".join(new[:20])
        if reporter is not None:
            reporter.write_line(msg, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
