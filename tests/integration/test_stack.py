"""`rlfoundry up` / `down`: S3, Prefect and MLflow servers on 127.0.0.1, a run through them with every
artifact on S3, credentials nowhere but the environment, and `down` stopping exactly those processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import cli, cli_env

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = "stack-test-key", "stack-secret-5b1f0e2a9c77d3"
# What a run's process does first (flows/cli): point itself at the running stack; prints the rollout token.
_APPLIED = (
    "import os; from infra.localstack.stack import apply_env; from rl_core.generation.rollout_server import "
    "ROLLOUT_TOKEN_ENV; apply_env(); print(os.environ.get(ROLLOUT_TOKEN_ENV, ''))"
)


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _listening(pid: int) -> set[str]:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return {c.laddr.ip for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _rollout_servers_from_up(fs, env: dict[str, str]) -> list[str]:
    """`rlfoundry up --rollout-servers 1` on the smoke run's warm-up checkpoint (this machine's copy)."""
    from rl_core.artifacts.paths import cache_dir

    (warm,) = fs.glob("rlfoundry/runs/_base/*/iter-0000/warmup/_manifest.json")
    model = cache_dir("checkpoints") / json.loads(fs.cat(warm))["outputs"]["checkpoint"]["sha256"]
    bad = cli(["up", "--rollout-servers", "1", "--model", str(model / "nothing")], env, timeout=120)
    assert bad.returncode == 2 and "nothing is not a folder" in bad.stderr, bad.stderr
    r = cli(["up", "--rollout-servers", "1", "--model", str(model)], env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"^rollout\s+(http://127\.0\.0\.1:\d+)", r.stdout, re.M)
    assert len(found) == 1 and f"rollout.server_urls=[{found[0]}]" in r.stdout, r.stdout
    with urllib.request.urlopen(found[0] + "/health", timeout=30) as health:
        assert health.status == 200
    return found


@pytest.mark.slow
def test_up_run_on_s3_down(tmp_path):
    state = tmp_path / "state"
    env = {k: v for k, v in cli_env(state).items() if not k.startswith(("PREFECT_API_URL", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    r = cli(["up"], env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    try:
        urls = dict(re.findall(r"^(S3|Prefect|MLflow)\s+(http://127\.0\.0\.1:\d+)", r.stdout, re.M))
        assert set(urls) == {"S3", "Prefect", "MLflow"}, r.stdout
        stack = json.loads((state / "stack" / "stack.json").read_text())["services"]
        for svc in stack.values():  # every socket the stack listens on is loopback-only
            assert _listening(svc["pid"]) <= {"127.0.0.1"}, svc
        with urllib.request.urlopen(urls["Prefect"] + "/", timeout=30) as page:
            assert b"<html" in page.read().lower()
        with urllib.request.urlopen(urls["MLflow"] + "/", timeout=30) as page:
            assert b"<html" in page.read().lower()
        again = cli(["up"], env, timeout=120)  # already up: same services, nothing new started
        assert again.returncode == 0 and urls["Prefect"] in again.stdout
        assert json.loads((state / "stack" / "stack.json").read_text())["services"] == stack

        # a run with no Prefect or S3 settings of its own uses the stack; credentials only from the env
        run_env = {k: v for k, v in env.items()}
        run = cli(
            [
                "run",
                "configs/smoke.yaml",
                "--run-id",
                "t1",
                "--set",
                "store.uri=s3://rlfoundry/runs",
                "--set",
                "experiment.iterations=1",
                *("--set", "rollout.engine=hf"),  # the stack is under test, not the engine (the suite budget)
            ],
            run_env,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert urls["MLflow"] in run.stdout

        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=urls["S3"], key=KEY, secret=SECRET, skip_instance_cache=True)
        assert fs.exists("rlfoundry/runs/t1/iter-0001/train/_manifest.json")
        assert fs.ls("rlfoundry/runs/_prefect"), "Prefect results are not on S3"
        assert fs.ls("rlfoundry/runs/_mlflow"), "MLflow artifacts are not on S3"

        api = stack["prefect"]["api"]
        runs = _post(f"{api}/flow_runs/filter", {"flow_runs": {"name": {"any_": ["t1"]}}})
        assert [fr["state"]["type"] for fr in runs] == ["COMPLETED"]
        ml = urls["MLflow"] + "/api/2.0/mlflow"
        exps = _post(f"{ml}/experiments/search", {"max_results": 10})["experiments"]
        exp = next(e for e in exps if e["name"] == "rlfoundry/smoke")
        assert exp["artifact_location"].startswith("s3://rlfoundry/runs/_mlflow")
        found = _post(
            f"{ml}/runs/search",
            {"experiment_ids": [exp["experiment_id"]], "filter": "tags.`rlfoundry.run_id` = 't1'"},
        )["runs"]
        assert sorted(x["info"]["run_name"] for x in found) == ["t1", "t1/iter-0000", "t1/iter-0001"]
        child = next(x for x in found if x["info"]["run_name"] == "t1/iter-0001")
        with urllib.request.urlopen(
            f"{urls['MLflow']}/get-artifact?path=manifests/train.json&run_uuid={child['info']['run_id']}",
            timeout=30,
        ) as a:  # the MLflow server reads the lineage artifact back from S3
            assert json.loads(a.read())["outputs"]["checkpoint"]["uri"].startswith("s3://rlfoundry/runs/t1/")
        seen = json.dumps(runs) + json.dumps(found) + run.stdout + run.stderr
        assert SECRET not in seen and KEY not in seen

        # rollout servers started by `up` on the run's warm-up checkpoint: loopback only, answering only
        # with up's token, the one `apply_env` gives a run (runs through rollout servers, S3 checkpoints
        # fetched with the token: tests/integration/test_rollout_servers.py)
        server_urls = _rollout_servers_from_up(fs, env)
        rollout = {"pid": json.loads((state / "stack" / "rollout.json").read_text())["servers"][0]["pid"]}
        assert _listening(rollout["pid"]) <= {"127.0.0.1"}
        token_file = state / "stack" / "rollout_token.json"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = json.loads(token_file.read_text())["token"]
        applied = subprocess.run(
            [sys.executable, "-c", _APPLIED],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert applied.returncode == 0 and applied.stdout.strip() == token, applied.stderr[-2000:]
        bearer = {"Authorization": f"Bearer {token}"}
        models = urllib.request.Request(server_urls[0] + "/v1/models", headers=bearer)
        with urllib.request.urlopen(models, timeout=30) as answer:
            assert answer.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server_urls[0] + "/v1/models", timeout=30)
        assert refused.value.code == 401
        # nor in any file the stack or the run wrote (logs, Prefect and MLflow databases, S3 data), except the
        # two that must hold it: the generated-credentials file is absent (they came from the environment)
        assert not (state / "stack" / "credentials.json").exists()
        for f in state.rglob("*"):
            if f.is_file() and f.name != "s3-identities.json":
                assert SECRET.encode() not in f.read_bytes(), f
    finally:
        sentinel = subprocess.Popen(["sleep", "60"])  # not the stack's: must survive `down`
        d = cli(["down"], env, timeout=120)
        assert d.returncode == 0, d.stderr
        assert sentinel.poll() is None
        sentinel.kill()
    assert {line.split()[0] for line in d.stdout.splitlines()} == {"s3", "prefect", "mlflow", "rollout-0"}
    for svc in [*stack.values(), rollout]:
        assert (
            not psutil.pid_exists(svc["pid"]) or psutil.Process(svc["pid"]).status() == psutil.STATUS_ZOMBIE
        )
    for url in urls.values():
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"{url} still answers after down"
    assert not (state / "stack" / "stack.json").exists()
    assert os.path.exists(state / "stack" / "s3")  # data kept for the next `up`
