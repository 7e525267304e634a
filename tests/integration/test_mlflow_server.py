"""A run tracked on an MLflow server with the store on this machine: the server refuses to register a local
path as a model version's source (a run ended in an 80-line traceback after every stage had committed); the
final policy then stays unregistered, with a warning, and an S3 store's checkpoint is registered as before."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import requests

from rl_core.artifacts.paths import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("mlflow") / "m.db"
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}"]
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the MLflow server did not start"
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.mark.slow
def test_a_local_checkpoint_is_not_registered_on_a_server_and_the_run_goes_on(server, caplog):
    from mlflow import MlflowClient

    from rl_core.run.lineage import Lineage

    client = MlflowClient(server)
    lin = Lineage(client, client.create_experiment("promote"))
    local = SimpleNamespace(sha256="a" * 64, uri="file:///tmp/store/r1/iter-0002/train/checkpoint")
    with caplog.at_level(logging.WARNING, logger="rlfoundry.lineage"):
        assert lin.promote("rlfoundry-x", "r1", 2, local, {"accuracy": 0.5}) is None
    assert "did not register file:///tmp/store/r1" in caplog.text and "stays in the store" in caplog.text
    assert client.search_model_versions("name='rlfoundry-x'") == []
    remote = SimpleNamespace(sha256="b" * 64, uri="s3://bucket/runs/r1/iter-0002/train/checkpoint")
    assert lin.promote("rlfoundry-x", "r1", 2, remote, {"accuracy": 0.5}) == "1"
