"""The s3:// store path against a real S3 server (SeaweedFS on 127.0.0.1), started by the fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rl_core.s3server import S3Server
from rl_core.store import ArtifactError, Store
from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = "rlf-test-key", "rlf-test-secret-d1e4f0c9a7"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    srv = S3Server.start(tmp_path_factory.mktemp("weed"), access_key=KEY, secret_key=SECRET)
    env = {
        "AWS_ENDPOINT_URL": srv.endpoint,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
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


def test_store_roundtrip_and_corruption_on_s3(s3):
    store = Store("s3://rlf-test/unit")
    df = pd.DataFrame({"a": [1, 2, 3], "ids": [[1], [2, 3], []]})
    ref = store.write_table(store.stage_uri("r", 1, "generate") + "/t.parquet", df)
    assert ref.uri.startswith("s3://rlf-test/unit/r/iter-0001/generate/")
    assert store.read_table(ref)["a"].tolist() == [1, 2, 3]
    store.write_manifest(store.stage_uri("r", 1, "generate"), {"outputs": {"t": ref.to_dict()}})
    assert store.read_manifest(store.stage_uri("r", 1, "generate"))["outputs"]["t"]["sha256"] == ref.sha256
    store.fs.pipe_file(store._path(ref.uri), b"not the same bytes")
    with pytest.raises(ArtifactError, match=r"corrupt: s3://rlf-test/unit/r/iter-0001/generate/t\.parquet"):
        store.read_table(ref)


def test_wrong_credentials_fail_clearly(s3, monkeypatch):
    import s3fs

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    s3fs.S3FileSystem.clear_instance_cache()
    store = Store("s3://rlf-test/unit2")
    with pytest.raises(Exception) as e:
        store.write_bytes("s3://rlf-test/unit2/x", b"1")
    assert "wrong" not in str(e.value)
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow
def test_run_and_replay_on_s3(s3, tmp_path):
    env = {**cli_env(tmp_path), **s3}
    args = [
        "run",
        "configs/smoke.yaml",
        "--run-id",
        "s3run",
        "--set",
        "store.uri=s3://rlf-test/runs",
        "--set",
        "experiment.iterations=1",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "store").exists()  # nothing went to the local default store
    show = subprocess.run([sys.executable, "-m", "flows.cli", "show", "s3run", "--json", "--store", "s3://rlf-test/runs"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    data = json.loads(show.stdout)
    assert data["iterations_committed"] == 1
    assert data["iterations"][0]["stages"]["train"]["artifacts"]["checkpoint"].startswith(
        "s3://rlf-test/runs/s3run/"
    )
    rep = subprocess.run([sys.executable, "-m", "flows.cli", "replay", "s3run", "--iteration", "1", "--stage", "train", "--json",
                          "--store", "s3://rlf-test/runs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    assert json.loads(rep.stdout)["identical"] is True
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    record = s3fs.S3FileSystem().cat_file("rlf-test/runs/s3run/run.json").decode()
    assert SECRET not in record and KEY not in record
