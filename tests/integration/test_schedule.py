"""The evaluation sweep started by its schedule alone: `rlfoundry serve` with a cron that fires every minute,
a run with an unevaluated checkpoint, and no flow run triggered by hand. (A Prefect scheduler that fails on
every loop left the suite green before: issue 9.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT, cli_env, run_cli


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_the_schedule_itself_runs_the_sweep(tmp_path):
    state = tmp_path / "state"
    r = run_cli(
        [
            "run",
            "configs/smoke.yaml",
            "--run-id",
            "sched",
            "--set",
            "eval.every=5",
            "--set",
            "rollout.engine=hf",
        ],
        state,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    store = state / "store" / "sched"
    # iteration 1's checkpoint: not evaluated by the run
    assert not (store / "iter-0001" / "evaluate").exists()
    env = cli_env(state)
    api = env["PREFECT_API_URL"]
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "serve",
            "--config",
            "configs/smoke.yaml",
            "--sweep-run",
            "sched",
            "--sweep-cron",
            "* * * * *",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    swept = store / "sweep" / "iter-0001" / "evaluate" / "_manifest.json"
    try:
        # the next minute, then the scheduler's and the runner's polls, then the sweep itself
        deadline = time.monotonic() + 300
        while not swept.exists():
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the scheduled sweep did not run within 5 minutes"
            time.sleep(2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    manifest = json.loads(swept.read_text())
    assert 0.0 <= manifest["metrics"]["accuracy"] <= 1.0
    deps = _post(f"{api}/deployments/filter", {"deployments": {"name": {"any_": ["evaluation-sweep"]}}})
    runs = _post(
        f"{api}/flow_runs/filter",
        {
            "flow_runs": {
                "deployment_id": {"any_": [deps[0]["id"]]},
                "state": {"type": {"any_": ["COMPLETED"]}},
            }
        },
    )
    ours = [fr for fr in runs if fr["parameters"].get("run_ids") == ["sched"]]
    assert ours, "no completed sweep run of this deployment"
    assert all(fr["auto_scheduled"] for fr in ours)  # created by the scheduler, not by a hand-made request
