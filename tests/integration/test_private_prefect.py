"""A run's private Prefect server (``infra.localstack.prefect_server.ensure_api``, used when
PREFECT_API_URL is unset): it listens on 127.0.0.1 only, writes its own log under the state dir, and a
SIGKILL of the process that started it (a killed `rlfoundry run`) leaves no server behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from tests.conftest import ROOT, cli_env

# Prefect is imported before the URL is set (as ensure_api's own start does): a flow with tasks then runs
# against the private server, not an ephemeral one of Prefect's own
PARENT = """
import json, time, psutil
from infra.localstack.prefect_server import ensure_api
url = ensure_api()
from prefect import flow, task
@task
def double(x):
    return 2 * x
@flow(name="tiny")
def tiny():
    return [double(1), double.submit(5).result()]
out = tiny()
kids = psutil.Process().children(recursive=True)
print(json.dumps({"url": url, "out": out, "procs": [p.pid for p in kids]}), flush=True)
time.sleep(600)
"""


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_private_server_dies_with_a_killed_run(tmp_path):
    state = tmp_path / "state"
    env = {k: v for k, v in cli_env(state).items() if not k.startswith("PREFECT_")}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        info = json.loads(parent.stdout.readline())
        procs = [psutil.Process(pid) for pid in info["procs"]]
        with urllib.request.urlopen(info["url"] + "/health", timeout=10) as r:
            assert r.status == 200
        assert info["out"] == [2, 10]
        servers = [p for p in procs if p.cmdline()[1:3] == ["-m", "uvicorn"]]
        assert len(servers) == 1, [p.cmdline() for p in servers]  # no ephemeral server of Prefect's own
        body = json.dumps({"flow_runs": {}}).encode()
        req = urllib.request.Request(
            info["url"] + "/flow_runs/filter", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            runs = json.loads(r.read())
        assert [(f["state"]["type"]) for f in runs] == ["COMPLETED"]
        listening = {
            c.laddr.ip for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}
        assert list((state / "logs").glob("prefect-server-*.log"))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while any(_running(p) for p in procs):
            assert time.monotonic() < deadline, [p.pid for p in procs if _running(p)]
            time.sleep(0.2)
    finally:
        parent.kill()
        parent.wait()
