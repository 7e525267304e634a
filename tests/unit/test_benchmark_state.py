"""Where a benchmark keeps its state (benchmarks/common.py): a temporary folder only when none is named. Five
benchmarks called ``os.environ.setdefault(KEY, tempfile.mkdtemp())``, which makes the folder whatever the
environment says: every smoke of the suite left an empty ``/tmp/rlf-*`` behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from benchmarks.common import smoke_state, temp_state


def test_a_named_state_dir_is_kept_and_no_folder_is_made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", "/somewhere/named")
    temp_state("rlf-x-")
    smoke_state(True, "x")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("RLFOUNDRY_STATE_DIR")
    temp_state("rlf-x-")
    (made,) = list(tmp_path.iterdir())
    assert made.name.startswith("rlf-x-") and str(made) == os.environ["RLFOUNDRY_STATE_DIR"]


def test_no_benchmark_makes_a_folder_before_it_knows_it_needs_one():
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    eager = [
        p.name for p in root.glob("*.py") if 'setdefault("RLFOUNDRY_STATE_DIR", tempfile' in p.read_text()
    ]
    assert eager == []
