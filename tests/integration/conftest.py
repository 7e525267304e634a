"""Integration tests run `rlfoundry` against the session's Prefect server (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    """The session's Prefect server, started for the first test marked slow: the others (`make test-fast`)
    start no server and no `rlfoundry run`."""
    if request.node.get_closest_marker("slow") is None:
        return None
    return request.getfixturevalue("prefect_api")
