"""Shared fixtures: every test gets its own state dir (store, MLflow DB, Prefect home)."""

from __future__ import annotations

import os
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


def cli_env(state: Path) -> dict[str, str]:
    """Environment for a `rlfoundry` subprocess writing under ``state``."""
    env = dict(os.environ)
    env.update(RLFOUNDRY_STATE_DIR=str(state), PREFECT_HOME=str(state / "prefect"), TQDM_DISABLE="1")
    return env
