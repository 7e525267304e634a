"""Optimizer state across ZeRO stages and world sizes: every ZeRO stage (0-3) x {same world size,
1 -> 2, 2 -> 1} continues from its stored weights and optimizer state (``rl_core.training.zero_state``'s
world-size-free form, as resume and replay read it) — bit for bit at the same layout, within ``LOSS_TOL`` /
``WEIGHT_TOL`` at another world size (the ranks sum gradients in another order: float32 rounding, nothing
more).

Three torchrun jobs of ``rl_core.training.dp_check`` (real DeepSpeed, gloo): one rank stores each stage's
state after 2 of 4 steps; two ranks do the same and continue from the one-rank states; one rank only continues
from the two-rank states (compared with the first job's uninterrupted run). The first two also continue once
without the optimizer state: the control, showing that a lost or ignored state is far outside the tolerance
(so the comparisons can fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.artifacts.paths import free_port

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("0", "1", "2", "3")
LOSS_TOL, WEIGHT_TOL = 1e-4, 1e-5  # docs/guides/scale-out.md documents them


def _job(tmp: Path, nproc: int, name: str, *more: str) -> dict:
    # vLLM rewrites os.environ (LD_PRELOAD, thread binding) in this process: do not pass that on.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "LOCAL_WORLD_SIZE") and not k.startswith("VLLM")
    }
    env.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    cmd += [f"--log_dir={tmp / f'{name}-agent'}"]  # not a torchelastic_* folder left in /tmp
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "rl_core.training.dp_check"]
    cmd += ["--zero-stage", *STAGES, "--steps", "4", "--resume-at", "2", "--save", str(tmp / name)]
    cmd += ["--out", str(tmp / f"{name}.json"), *more]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp / f"{name}.json").read_text())
    assert data["world_size"] == nproc and set(data["stages"]) == set(STAGES)
    return data["stages"]


@pytest.mark.slow
def test_every_zero_stage_resumes_at_the_same_and_at_another_world_size(tmp_path: Path):
    one = _job(tmp_path, 1, "one")
    two = _job(tmp_path, 2, "two", "--load", str(tmp_path / "one"))  # 1 -> 2
    # 2 -> 1, against the one-rank job's uninterrupted run
    back = _job(
        tmp_path,
        1,
        "back",
        "--load",
        str(tmp_path / "two"),
        "--only-load",
        "--reference",
        str(tmp_path / "one"),
    )
    for where, got in (("one rank", one), ("two ranks", two)):
        # The control, once per job: without the optimizer state the weights end far outside the tolerance.
        assert got["0"]["no_state_weight_gap"] > 100 * WEIGHT_TOL, (where, got["0"])
        for stage in STAGES:
            cell = got[stage]
            # Same layout: the resumed run is the uninterrupted one, losses and weights bit for bit.
            assert cell["resumed_identical"] is True, (stage, where)
            assert len({round(x, 5) for x in cell["losses"]}) > 1  # the steps really moved the policy
    for stage in STAGES:
        for where, cell in (("1 -> 2", two[stage]), ("2 -> 1", back[stage])):
            assert cell["from_other_loss_gap"] < LOSS_TOL, (stage, where, cell)
            assert cell["from_other_weight_gap"] < WEIGHT_TOL, (stage, where, cell)
        # Data-parallel equivalence: two ranks take the same steps as one.
        gaps = [abs(a - b) for a, b in zip(one[stage]["losses"], two[stage]["losses"], strict=True)]
        assert max(gaps) < LOSS_TOL, (stage, one[stage]["losses"], two[stage]["losses"])
