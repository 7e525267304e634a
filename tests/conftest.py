"""Shared fixtures: every test gets its own state dir (store, MLflow DB, Prefect home)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(d))
    monkeypatch.setenv("PREFECT_HOME", str(d / "prefect"))
    return d


_API: dict[str, str] = {}


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """One Prefect API server for the whole session (127.0.0.1), shared by every `rlfoundry` subprocess."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["RLFOUNDRY_STATE_DIR"] = str(home / "state")
    from flows.server import free_port, start_server, wait_healthy

    port = free_port()
    proc = start_server(port, ui=True, log=home / "server.log")  # the UI for the browser test
    url = f"http://127.0.0.1:{port}/api"
    wait_healthy(url, proc)
    _API["url"] = url
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except Exception:
        proc.kill()


def cli_env(state: Path) -> dict[str, str]:
    """Environment for a `rlfoundry` subprocess writing under ``state``, using the session's Prefect server."""
    env = dict(os.environ)
    env.update(RLFOUNDRY_STATE_DIR=str(state), TQDM_DISABLE="1")
    if "url" in _API:
        env["PREFECT_API_URL"] = _API["url"]
    return env


def run_cli(args: list[str], state: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """``rlfoundry ARGS`` in a subprocess writing under ``state`` (see ``cli_env``), output captured."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=cli_env(state),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
