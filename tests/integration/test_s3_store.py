"""The s3:// store path against a real S3 server (SeaweedFS on 127.0.0.1), started by the fixture."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from infra.localstack.s3_server import WEED_SOCKETS, S3Server
from rl_core.artifacts.manifest import Manifest, Timings
from rl_core.artifacts.store import ArtifactError, Store
from tests.conftest import S3_KEY as KEY
from tests.conftest import S3_SECRET as SECRET
from tests.conftest import cli, cli_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # an S3 server
def test_store_roundtrip_and_corruption_on_s3(s3):
    store = Store("s3://rlf-test/unit")
    df = pd.DataFrame({"a": [1, 2, 3], "ids": [[1], [2, 3], []]})
    ref = store.write_table(store.stage_uri("r", 1, "generate") + "/t.parquet", df)
    assert ref.uri.startswith("s3://rlf-test/unit/r/iter-0001/generate/")
    assert store.read_table(ref)["a"].tolist() == [1, 2, 3]
    manifest = Manifest(
        run_id="r",
        iteration=1,
        stage="generate",
        inputs={},
        outputs={"t": ref},
        config_hash="h",
        code_version="v",
        timings=Timings(seconds=0.1, started_at=0.0),
    )
    store.write_manifest(store.stage_uri("r", 1, "generate"), manifest)
    assert store.read_manifest(store.stage_uri("r", 1, "generate")).outputs["t"] == ref
    store.fs.pipe_file(store._path(ref.uri), b"not the same bytes")
    with pytest.raises(ArtifactError, match=r"corrupt: s3://rlf-test/unit/r/iter-0001/generate/t\.parquet"):
        store.read_table(ref)


@pytest.mark.slow  # an S3 server
def test_shared_stage_lock_on_s3(s3):
    """The store lock on S3's conditional create: four runs at once build a shared stage once; a lock from
    another host whose heartbeat stopped is taken over after the stale time, not before."""
    from rl_core.artifacts.store_lock import StageLock
    from tests.unit.test_store_lock import PREFIX, _plant, race

    store = Store("s3://rlf-test/locks")
    uri = f"{store.root}/x.lock"
    assert store.create_exclusive(uri, b"first") and not store.create_exclusive(uri, b"second")
    assert store.read_bytes(uri) == b"first"
    built, results = race(store, 4, stale_after_s=30, heartbeat_s=1)
    assert len(built) == 1 and sum(m.reused for m in results) == 3
    assert store.fs.ls(f"rlf-test/locks/{PREFIX}/iter-0000", refresh=True) == [
        f"rlf-test/locks/{PREFIX}/iter-0000/warmup"
    ]  # no lock, heartbeat or marker left

    other = Store("s3://rlf-test/locks2")
    _plant(other, {"token": "eeee", "owner": "gone", "host": "another-pod", "pid": 1})
    t0 = time.monotonic()
    with StageLock(other, other.stage_uri(PREFIX, 0, "warmup"), owner="me", stale_after_s=2, heartbeat_s=0.5):
        waited = time.monotonic() - t0
    assert 2 <= waited < 15, waited


@pytest.mark.slow  # an S3 server
def test_wrong_credentials_fail_clearly(s3, monkeypatch):
    import s3fs

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    s3fs.S3FileSystem.clear_instance_cache()
    store = Store("s3://rlf-test/unit2")
    with pytest.raises(Exception) as e:
        store.write_bytes("s3://rlf-test/unit2/x", b"1")
    assert "wrong" not in str(e.value)
    s3fs.S3FileSystem.clear_instance_cache()


def _hashes(env, run_id, store) -> list[str]:
    show = cli(["show", run_id, "--json", "--store", store], env, timeout=300)
    assert show.returncode == 0, show.stderr[-2000:]
    return [it["policy_sha256"] for it in json.loads(show.stdout)["iterations"]]


@pytest.fixture(scope="module")
def s3_run(s3, tmp_path_factory):
    """The smoke experiment run whole on the S3 store: (env, completed process). HF engine: the store is what
    is tested here, and it starts in a second instead of vLLM's ~20 s (a vLLM run on S3: test_stack.py)."""
    env = {**cli_env(tmp_path_factory.mktemp("s3run")), **s3}
    r = cli(
        [
            "run",
            "configs/smoke.yaml",
            "--run-id",
            "s3run",
            "--set",
            "store.uri=s3://rlf-test/runs",
            "--set",
            "rollout.engine=hf",
        ],
        env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return env, r


@pytest.mark.slow
def test_run_and_replay_on_s3(s3, s3_run, tmp_path):
    env, r = s3_run
    assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "store").exists()  # nothing went to the local default store
    # children of the fork server (tests/forkserver.py): the commands as programs, their imports done once
    show = cli(["show", "s3run", "--json", "--store", "s3://rlf-test/runs"], env, timeout=300)
    data = json.loads(show.stdout)
    assert data["iterations_committed"] == 2
    assert data["iterations"][0]["stages"]["train"]["artifacts"]["checkpoint"].startswith(
        "s3://rlf-test/runs/s3run/"
    )
    replay = ["replay", "s3run", "--iteration", "1", "--stage", "train", "--json"]
    rep = cli([*replay, "--store", "s3://rlf-test/runs"], env, timeout=600)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    assert json.loads(rep.stdout)["identical"] is True
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    record = s3fs.S3FileSystem().cat_file("rlf-test/runs/s3run/run.json").decode()
    assert SECRET not in record and KEY not in record


# SIGKILLing the S3 server can leave a chunk the filer recorded but no volume kept (written in the instant
# before the kill); the resume clears that uncommitted stage folder and SeaweedFS logs the lookup it failed.
@pytest.mark.slow
@pytest.mark.server_log_allows(r"LookupFileId .* volume \d+ not found")
def test_s3_outage_fails_clearly_then_resume_matches(s3, s3_run, tmp_path):
    """Kill the S3 server mid-run: bounded retries, a failure naming the endpoint, nothing committed lost;
    after a restart on the same ports and data, resume ends with the uninterrupted run's weights."""
    import s3fs

    srv = S3Server.start(tmp_path / "weed", access_key=KEY, secret_key=SECRET)
    env = {**cli_env(tmp_path / "state"), **s3, "AWS_ENDPOINT_URL": srv.endpoint}
    fs = s3fs.S3FileSystem(endpoint_url=srv.endpoint, key=KEY, secret=SECRET, skip_instance_cache=True)
    fs.mkdir("outage")
    args = [
        "run",
        "configs/smoke.yaml",
        "--run-id",
        "o1",
        "--set",
        "store.uri=s3://outage/runs",
        "--set",
        "store.retries=3",
        "--set",
        "store.retry_max_wait_s=1",
        "--set",
        "rollout.engine=hf",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        marker = "outage/runs/o1/iter-0001/generate/_manifest.json"
        deadline = time.monotonic() + 600
        while not fs.exists(marker):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            fs.invalidate_cache()
            time.sleep(0.2)
        srv.kill()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 3, err[-3000:]
    assert f"S3 endpoint {srv.endpoint} unreachable" in err
    printed = err.rsplit("once the store answers again: ", 1)[1].split("\n")[0].split()
    assert printed == ["rlfoundry", "resume", "o1", "--store", "s3://outage/runs"]  # works as printed
    assert SECRET not in out + err
    pids = [srv.server.pid]
    srv = S3Server.start(tmp_path / "weed", access_key=KEY, secret_key=SECRET, ports=srv.ports)
    pids.append(srv.server.pid)
    try:
        r = cli(printed[1:], env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert SECRET not in r.stdout + r.stderr
        resumed = _hashes(env, "o1", "s3://outage/runs")
    finally:
        srv.stop()
    assert resumed == _hashes(s3_run[0], "s3run", "s3://rlf-test/runs")
    # Nothing of either weed (the killed one, the stopped one) is left in /tmp: their sockets (weed names them
    # by port, gRPC ports at +10000) went at the restart and at the stop; glog wrote no files there.
    ports = {*srv.ports.values(), *(p + 10000 for p in srv.ports.values())}
    left = [p.name for p in WEED_SOCKETS.glob("seaweedfs-*.sock") if int(p.stem.rsplit("-", 1)[1]) in ports]
    glog = [p.name for p in Path(tempfile.gettempdir()).glob("weed.*") if p.suffix[1:] in map(str, pids)]
    assert left == [] and glog == [], (left, glog)
