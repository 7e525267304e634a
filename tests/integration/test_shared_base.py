"""Two real runs on one shared base model (``_base/<hash>``: same model, task, warm-up and seed): the first is
SIGKILLed mid-warm-up while holding the base's store lock, the second — started while the first was building
— waits, takes the abandoned lock over (its holder's process is gone), builds the warm-up and finishes; the
killed run resumes onto the warm-up the other committed and ends with the same policy. The lock's rules
one by one (and on S3): tests/unit/test_store_lock.py, tests/integration/test_s3_store.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env, show_json

RUN = [
    "configs/smoke.yaml",
    *("--set", "rollout.engine=hf", "--set", "tracking.enabled=false"),
    *("--set", "experiment.iterations=1"),
]


def _in_thread(args: list[str], env: dict[str, str], out: dict, key: str) -> threading.Thread:
    t = threading.Thread(target=lambda: out.__setitem__(key, cli(args, env, timeout=600)))
    t.start()
    return t


@pytest.mark.slow
def test_a_run_killed_mid_warmup_does_not_stop_the_one_waiting_on_its_base(tmp_path: Path):
    env = cli_env(tmp_path)
    killed = {**env, "RLFOUNDRY_FAULT": "warmup:outputs@0"}  # dies with the warm-up written, not committed
    got: dict = {}
    first = _in_thread(["run", *RUN, "--run-id", "first"], killed, got, "first")
    deadline = time.monotonic() + 300
    locks: list[Path] = []
    while not locks and time.monotonic() < deadline and first.is_alive():
        locks = list((tmp_path / "store" / "_base").glob("*/iter-0000/warmup.lock"))
        time.sleep(0.1)
    assert locks, "the first run never took the warm-up's lock"
    second = _in_thread(["run", *RUN, "--run-id", "second"], env, got, "second")
    first.join()
    second.join()
    assert got["first"].returncode == -9, got["first"].stderr[-2000:]  # killed by its fault, holding the lock
    assert got["second"].returncode == 0, got["second"].stderr[-3000:]
    assert "breaking the lock" in got["second"].stderr + got["second"].stdout
    base = locks[0].parent
    assert (base / "warmup" / "_manifest.json").exists()
    assert sorted(p.name for p in base.iterdir()) == ["init", "warmup"]  # no lock, heartbeat or marker left

    resumed = cli(["resume", "first"], env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    hashes = {
        r: [it["policy_sha256"] for it in show_json(tmp_path, r)["iterations"]] for r in ("first", "second")
    }
    assert hashes["first"] == hashes["second"] and len(hashes["first"]) == 1
