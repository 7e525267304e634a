"""Sandbox tests run `rlfoundry` commands too: they get the session's Prefect server (tests/conftest.py).
Helpers shared by the sandbox tests live here."""

from __future__ import annotations

import time

import pytest

from envs.sandbox.core import slot_processes


@pytest.fixture(autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    """The session's Prefect server, started for the first test marked slow: the others (`make test-fast`)
    start no server and no `rlfoundry run`."""
    if request.node.get_closest_marker("slow") is None:
        return None
    return request.getfixturevalue("prefect_api")


def leftover_slot_processes(wait_s: float = 3.0, before: set[int] | None = None) -> list[int]:
    """``slot_processes()`` not in ``before`` (a pool's own containers), after up to ``wait_s`` for the kernel
    to finish killing them."""
    deadline = time.monotonic() + wait_s
    while (out := sorted(set(slot_processes()) - (before or set()))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return out
