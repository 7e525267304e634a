"""`rlfoundry deploy --work-pool`: the deployments on a Prefect work pool of the session's server, executed by
a separately started process worker (the command `deploy` prints), and the Kubernetes pool that
infra/k8s/prefect-worker.yaml's worker polls (registered, not run: no cluster here)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from pathlib import Path

import psutil
import pytest
import yaml

from rl_core.artifacts.paths import free_port
from rl_core.pipeline.stages import ITERATION_STAGES
from tests.conftest import _delete_deployments, cli, cli_env, prefect_api_call, quiet_cron, run_cli

# Prefect 3.7's background task mark_deployments_ready, fired when a worker polls its pool, fails at once on
# its SQLite database ("database is locked"): the Prefect bug test_serve.py names; every other server error
# still fails these tests.
pytestmark = pytest.mark.server_log_allows(r"mark_deployments_ready|database is locked")

ROOT = Path(__file__).resolve().parents[2]
CRON = quiet_cron()  # fires 12 hours from now: never while the suite runs
K8S_POOL = "rlfoundry-k8s"  # the pool infra/k8s/prefect-worker.yaml's worker polls
SMOKE_HF = ["--config", "configs/smoke.yaml", "--set", "rollout.engine=hf", "--sweep-cron", CRON]


@pytest.fixture
def pools(prefect_api):
    """Names of the work pools a test creates; they and the deployments are deleted afterwards."""
    made: list[str] = []
    yield made
    _delete_deployments(prefect_api)
    for name in made:
        with contextlib.suppress(urllib.error.HTTPError):  # 404: never created
            prefect_api_call(f"{prefect_api}/work_pools/{urllib.parse.quote(name)}", method="DELETE")


def _on_pool(api: str, pool: str) -> dict[str, dict]:
    found = prefect_api_call(f"{api}/deployments/filter", {"work_pools": {"name": {"any_": [pool]}}})
    return {d["name"]: d for d in found}


def _no_server_env(state: Path) -> dict[str, str]:
    env = cli_env(state)
    env.pop("PREFECT_API_URL", None)
    return env


BAD_INPUT = [
    pytest.param(
        lambda st: run_cli(["deploy", "--work-pool", "bad/pool"], st),
        "invalid work pool name 'bad/pool'",
        id="name",
    ),
    pytest.param(
        lambda st: cli(["deploy", "--work-pool", "wp", *SMOKE_HF], _no_server_env(st), timeout=300),
        "no Prefect server to register with",
        id="no-server",
    ),
    pytest.param(
        lambda st: run_cli(
            ["deploy", "--work-pool", "wp", *SMOKE_HF],
            st,
            timeout=300,
            env={"PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"},
        ),
        "no Prefect server answers at PREFECT_API_URL=http://127.0.0.1:",
        id="unreachable",
    ),
]


@pytest.mark.slow  # rlfoundry deploy processes
@pytest.mark.parametrize("call, message", BAD_INPUT)
def test_deploy_refuses_bad_input(tmp_path, call, message):
    r = call(tmp_path / "state")
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert message in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow  # needs the session's Prefect server
def test_existing_pool_of_another_type_is_refused(tmp_path, prefect_api, pools):
    name = f"wp-proc-{secrets.token_hex(3)}"
    pools.append(name)
    prefect_api_call(f"{prefect_api}/work_pools/", {"name": name, "type": "process"})
    r = run_cli(
        ["deploy", "--work-pool", name, "--pool-type", "kubernetes", *SMOKE_HF], tmp_path, timeout=300
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"work pool '{name}' exists with type 'process', not 'kubernetes'" in r.stderr
    assert _on_pool(prefect_api, name) == {}  # nothing registered
    assert prefect_api_call(f"{prefect_api}/work_pools/{name}")["type"] == "process"


@pytest.mark.slow  # needs the session's Prefect server
def test_kubernetes_pool_agrees_with_the_manifests(tmp_path, prefect_api, pools):
    """The pool `deploy --pool-type kubernetes` creates is the one infra/k8s's worker polls, of the type it
    starts, and its Jobs are the pods the manifests expect (namespace, flow-run label, the ConfigMap and S3
    Secret's environment) running the manifests' image from its working directory."""
    manifest = [d for d in yaml.safe_load_all((ROOT / "infra/k8s/prefect-worker.yaml").read_text()) if d]
    (worker,) = [d for d in manifest if d["kind"] == "Deployment"]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    command = ["prefect", "worker", "start", "--pool", K8S_POOL, "--type", "kubernetes"]
    assert container["command"][:7] == command

    pools.append(K8S_POOL)
    r = run_cli(
        ["deploy", "--work-pool", K8S_POOL, "--pool-type", "kubernetes", *SMOKE_HF], tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"work pool {K8S_POOL} (kubernetes, created)" in r.stdout
    assert shlex.join(command) in r.stdout
    assert "--set store.uri=s3://" in r.stdout  # a local store would stay in the pod
    pool = prefect_api_call(f"{prefect_api}/work_pools/{K8S_POOL}")
    assert pool["type"] == "kubernetes"
    template = pool["base_job_template"]
    assert template["variables"]["properties"]["namespace"]["default"] == "rlfoundry"
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "flow-run"
    assert {"configMapRef": {"name": "rlfoundry-config"}} in pod["spec"]["containers"][0]["envFrom"]
    deps = _on_pool(prefect_api, K8S_POOL)
    assert sorted(deps) == ["evaluation-sweep", "experiment", "replay"]
    for d in deps.values():
        assert d["job_variables"] == {"image": container["image"]}
        assert d["entrypoint"].startswith("flows/deployments.py:") and not d["pull_steps"]


def _descendants(pid: int, seen: dict[tuple[int, float], list[str]]) -> None:
    """Add the live descendants of ``pid`` to ``seen``: (pid, start time) -> command line."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for c in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.setdefault((c.pid, c.create_time()), c.cmdline())


def _alive(seen: dict[tuple[int, float], list[str]]) -> dict[int, list[str]]:
    """The processes of ``seen`` still running (same pid and start time, not a zombie)."""
    out = {}
    for (pid, started), cmd in seen.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = cmd
    return out


def _stop(worker: subprocess.Popen) -> None:
    """Stop the worker as Prefect means it to be stopped: a SIGTERM (or Ctrl-C) asks it to stop; a second one
    makes it SIGKILL itself (Prefect 3.7.7's process worker ignores the first when idle)."""
    for _ in range(2):
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=15)


def _deploy_process_pool(state: Path, api: str, pool: str) -> tuple[list[str], dict]:
    """`rlfoundry deploy` on a new process pool: the worker command it printed, the experiment deployment."""
    r = run_cli(["deploy", "--work-pool", pool, *SMOKE_HF], state, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"work pool {pool} (process, created)" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if " worker start " in ln)
    assignment, *argv = shlex.split(line)
    assert assignment == f"PREFECT_API_URL={api}"
    venv_prefect = str(Path(sys.executable).parent / "prefect")
    assert argv == [venv_prefect, "worker", "start", "--pool", pool, "--type", "process"]
    deps = _on_pool(api, pool)
    exp = deps["experiment"]
    assert exp["entrypoint"] == "flows/deployments.py:experiment"
    assert exp["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
    ]
    assert exp["parameters"]["config"]["rollout"]["engine"] == "hf"  # the --set override is the form default
    assert [s["schedule"]["cron"] for s in deps["evaluation-sweep"]["schedules"]] == [CRON]
    return argv, exp


def _wait(api: str, flow_run_id: str, worker: subprocess.Popen, log: Path, seen: dict) -> dict:
    """The flow run once finished (at most 10 minutes), recording the worker's descendants meanwhile."""
    deadline = time.monotonic() + 600
    while True:
        fr = prefect_api_call(f"{api}/flow_runs/{flow_run_id}")
        if fr["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return fr
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"flow run not finished in 600 s: {fr['state']}"
        _descendants(worker.pid, seen)
        time.sleep(1)


@pytest.mark.slow
def test_process_worker_runs_the_experiment(tmp_path, prefect_api, pools):
    """Deploy on a new process pool, start the worker `deploy` printed, trigger the experiment through the
    API: the worker runs it in a child process of the project's venv, its stages land in the store, and
    stopping the worker leaves no process behind."""
    state, pool, log = tmp_path / "state", f"wp-{secrets.token_hex(3)}", tmp_path / "worker.log"
    pools.append(pool)
    argv, exp = _deploy_process_pool(state, prefect_api, pool)
    env = {**cli_env(state), "PREFECT_API_URL": prefect_api, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    seen: dict[tuple[int, float], list[str]] = {}
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            fr = prefect_api_call(
                f"{prefect_api}/deployments/{exp['id']}/create_flow_run", {"parameters": {"run_id": "pool1"}}
            )
            fr = _wait(prefect_api, fr["id"], worker, log, seen)
            deadline = time.monotonic() + 60  # the flow-run process exits by itself once its run is final
            while _alive(seen) and time.monotonic() < deadline:
                time.sleep(1)
            _stop(worker)
            left = _alive(seen)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
            for pid in _alive(seen):
                os.kill(pid, signal.SIGKILL)
    assert fr["state"]["type"] == "COMPLETED", (fr["state"], log.read_text()[-3000:])
    assert fr["work_pool_name"] == pool
    assert worker.returncode is not None and not left, left
    # the run executed in a child process of the worker, on the project's venv interpreter
    engines = [cmd for cmd in seen.values() if cmd[1:3] == ["-m", "prefect.engine"]]
    assert engines and all(Path(cmd[0]).parent == Path(sys.executable).parent for cmd in engines), seen

    shown = run_cli(["show", "pool1", "--json"], state, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    data = json.loads(shown.stdout)
    assert data["iterations_committed"] == data["iterations_planned"] == 2
    assert all(data["base"][s]["status"] == "committed" for s in ("init", "warmup", "evaluate"))
    for it in data["iterations"]:
        # every stage this config runs (all of the table's but the curriculum, which is off)
        assert {s: v["status"] for s, v in it["stages"].items()} == dict.fromkeys(
            [s for s in ITERATION_STAGES if s != "curriculum"], "committed"
        )
