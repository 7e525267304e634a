"""Integration tests run `rlfoundry` against the session's Prefect server (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _session_prefect_server(prefect_api: str) -> str:
    return prefect_api
