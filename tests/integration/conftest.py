"""Integration tests run `rlfoundry` against the session's Prefect server (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.conftest import prefect_api_if_slow


@pytest.fixture(scope="session", autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    return prefect_api_if_slow(request)
