"""Sandbox tests run `rlfoundry` commands too: they get the session's Prefect server (tests/conftest.py).
Helpers shared by the sandbox tests live here."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.sandbox.core import slot_processes
from tests.conftest import prefect_api_if_slow


@pytest.fixture(scope="session", autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    return prefect_api_if_slow(request)


def leftover_slot_processes(wait_s: float = 3.0, before: set[int] | None = None) -> list[int]:
    """``slot_processes()`` not in ``before`` (a pool's own containers), after up to ``wait_s`` for the kernel
    to finish killing them."""
    deadline = time.monotonic() + wait_s
    while (out := sorted(set(slot_processes()) - (before or set()))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return out


def sandbox_exec(prog: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``rlfoundry sandbox exec PROG OPTIONS... --json``, as a user runs it (its own process)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "sandbox", "exec", str(prog), *options, "--json"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
