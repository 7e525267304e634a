"""Integration tests run `rlfoundry` against the session's Prefect server (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    """The session's Prefect server, for every `rlfoundry` process of the session; session-scoped, so it is
    up before any module's fixtures start their runs. Not started when no selected test is marked slow
    (`make test-fast`: those start no server and no `rlfoundry run`)."""
    if not any(item.get_closest_marker("slow") for item in request.session.items):
        return None
    return request.getfixturevalue("prefect_api")
