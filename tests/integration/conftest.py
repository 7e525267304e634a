"""Integration tests run `rlfoundry` against the session's Prefect server (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import prefect_api_if_slow


@pytest.fixture(scope="session", autouse=True)
def _session_prefect_server(request: pytest.FixtureRequest) -> str | None:
    return prefect_api_if_slow(request)


@pytest.fixture
def chromium_env() -> Iterator[dict[str, str]]:
    """The environment of a Chromium that Playwright starts: a temp folder of its own, removed after the test
    (Chromium leaves a folder in the temp folder even after a clean quit). A short path: a socket Chromium
    makes in it may have 107 bytes at most."""
    folder = tempfile.mkdtemp(prefix="rlf-chromium-", dir="/tmp")
    yield {**os.environ, "TMPDIR": folder}
    shutil.rmtree(folder, ignore_errors=True)
