"""A multi-turn tool-use run (vLLM, DeepSpeed) with train.packing on learns what padding learns: its train
stage, run again padded from the same stored inputs (the stage body, as `replay` runs it), gives the same
losses within fp32 tolerance and the same weights within 1e-5, through the recompute and reference passes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from tests.conftest import cli_env, run_cli, run_script
from tests.integration.test_multiturn import SMALL

# Several optimizer steps (4 mini-batches x 2 epochs), the anchor recomputed, a KL term to the reference; the
# briefly warmed-up policy of SMALL (a reward signal; episodes of several turns, observations masked).
SETS = [
    "train.micro_batch_size=8",
    "train.epochs=2",
    "train.old_logprobs=recompute",
    "train.kl_coef=0.05",
    "train.packing=true",
    "train.pack_tokens=96",
]
PADDED_TRAIN = """
import json, sys
from rl_core.schema.config import config_from_dict
from rl_core.run.context import RunContext, open_store
from rl_core.artifacts.stage import StageJob
from rl_core.pipeline.stages import STAGES

cfg = config_from_dict(json.load(open(sys.argv[1]))["config"], "run.json")
cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"packing": False, "pack_tokens": 0})})
store = open_store(cfg)
inputs = store.read_manifest(store.stage_uri("packed", 1, "train")).inputs
ctx = RunContext(cfg, "packed", store)
result = STAGES["train"].body(ctx, StageJob(1, inputs, f"{store.root}/_padded/train"))
ctx.held.close()
print(json.dumps({"metrics": result.metrics, "checkpoint": result.outputs["checkpoint"].uri}))
"""


def _weights(uri: str) -> dict:
    return load_file(Path(uri.removeprefix("file://")) / "model.safetensors")


@pytest.mark.slow
def test_packed_train_stage_matches_the_padded_one(tmp_path):
    args = [a for s in SETS for a in ("--set", s)]
    r = run_cli(["run", "configs/tooluse.yaml", "--run-id", "packed", *SMALL, *args], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    it = tmp_path / "store" / "packed" / "iter-0001"
    manifest = json.loads((it / "train" / "_manifest.json").read_text())
    assert "reference" in manifest["inputs"]
    rollouts = pd.read_parquet(it / "generate" / "rollouts.parquet")
    assert (rollouts["loss_mask"].map(sum) < rollouts["completion_ids"].map(len)).any()  # observations
    script = tmp_path / "padded_train.py"  # a child of the suite's fork server, as run_cli's commands
    script.write_text(PADDED_TRAIN)
    p = run_script(str(script), [str(tmp_path / "store" / "packed" / "run.json")], cli_env(tmp_path), 600)
    assert p.returncode == 0, p.stderr[-3000:]
    padded = json.loads(p.stdout.strip().splitlines()[-1])
    packed = manifest["metrics"]
    for key in ("loss", "first_step_loss", "pg_loss", "kl", "entropy", "logprob_mismatch_mean"):
        assert packed[key] == pytest.approx(padded["metrics"][key], abs=1e-5), key
    assert packed["optimizer_steps"] == padded["metrics"]["optimizer_steps"] == 8 and packed["kl"] > 0
    before = _weights(manifest["inputs"]["policy"]["uri"])
    ours, theirs = _weights(manifest["outputs"]["checkpoint"]["uri"]), _weights(padded["checkpoint"])
    moved = max(float((ours[k] - before[k]).abs().max()) for k in before)
    gap = max(float((ours[k] - theirs[k]).abs().max()) for k in before)
    assert moved > 1e-4 and gap < 1e-5, (moved, gap)
