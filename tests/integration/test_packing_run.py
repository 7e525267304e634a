"""A multi-turn tool-use run (vLLM, DeepSpeed) with train.packing on learns what the padded run learns: same
rollouts, train losses and trained weights equal within fp32 tolerance, through the recompute and reference
(KL) passes too."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from tests.conftest import run_cli
from tests.integration.test_multiturn import SMALL

# Several optimizer steps (4 mini-batches x 2 epochs), the anchor recomputed, a KL term to the reference.
TRAIN = ["train.micro_batch_size=8", "train.epochs=2", "train.old_logprobs=recompute", "train.kl_coef=0.05"]


def _iteration(state: Path, run_id: str, *sets: str) -> Path:
    args = [a for s in (*TRAIN, *sets) for a in ("--set", s)]
    r = run_cli(["run", "configs/tooluse.yaml", "--run-id", run_id, *SMALL, *args], state)
    assert r.returncode == 0, r.stderr[-3000:]
    return state / "store" / run_id / "iter-0001"


@pytest.mark.slow
def test_packed_run_matches_the_padded_run(tmp_path):
    padded = _iteration(tmp_path, "padded")
    packed = _iteration(tmp_path, "packed", "train.packing=true", "train.pack_tokens=96")
    rollouts = [pd.read_parquet(it / "generate" / "rollouts.parquet") for it in (padded, packed)]
    assert (
        rollouts[0]["completion_ids"].map(list).tolist() == rollouts[1]["completion_ids"].map(list).tolist()
    )
    assert (rollouts[0]["loss_mask"].map(sum) < rollouts[0]["completion_ids"].map(len)).any()  # observations
    metrics = [
        json.loads((it / "train" / "_manifest.json").read_text())["metrics"] for it in (padded, packed)
    ]
    for key in ("loss", "first_step_loss", "pg_loss", "kl", "entropy", "logprob_mismatch_mean"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], abs=1e-5), key
    assert metrics[0]["optimizer_steps"] == metrics[1]["optimizer_steps"] == 8
    assert metrics[0]["kl"] > 0  # the reference pass ran (after the first step the policy moved)
    weights = [load_file(it / "train" / "checkpoint" / "model.safetensors") for it in (padded, packed)]
    before = load_file(
        Path(
            json.loads((padded / "train" / "_manifest.json").read_text())["inputs"]["policy"][
                "uri"
            ].removeprefix("file://")
        )
        / "model.safetensors"
    )
    moved = max(float((weights[0][k] - before[k]).abs().max()) for k in before)
    gap = max(float((weights[1][k] - weights[0][k]).abs().max()) for k in before)
    assert moved > 1e-4 and gap < 1e-5 * max(1.0, moved * 100), (moved, gap)
