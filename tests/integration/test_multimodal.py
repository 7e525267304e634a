"""A multimodal run through the real stages (HF engine with images, DeepSpeed trainer): rollouts store the
image each episode was conditioned on and its placeholder tokens, the trainer recomputes the engine's
logprobs from them, and generate replays bit-identically."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from envs.shapes import ShapesEnv
from rl_core.models.vision import image_prefix
from rl_core.schema.config import load_config
from tests.conftest import replayed_identical, run_cli

SMALL = [
    "--set",
    "tracking.enabled=false",
    "--set",
    "experiment.iterations=1",
    "--set",
    "warmup.steps=30",
    "--set",
    "rollout.prompts_per_iteration=8",
    "--set",
    "rollout.n=4",
    "--set",
    "task.train_size=300",
    "--set",
    "task.heldout_size=16",
    "--set",
    "eval.every=1",
]


@pytest.mark.slow
def test_shapes_run_stores_images_and_replays(tmp_path):
    r = run_cli(["run", "configs/shapes.yaml", "--run-id", "mm", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    it = tmp_path / "store" / "mm" / "iter-0001"
    df = pd.read_parquet(it / "generate" / "rollouts.parquet")
    gen = json.loads((it / "generate" / "_manifest.json").read_text())
    ckpt = Path(gen["inputs"]["policy"]["uri"].removeprefix("file://"))
    cfg = load_config("configs/shapes.yaml", [a for a in SMALL if a != "--set"])
    env = ShapesEnv()
    tasks = {t["task_id"]: t for t in env.tasks("train", cfg.task, cfg.experiment.seed)}
    prefix = image_prefix(ckpt)
    assert len(prefix) == 16 and len(df) == 32
    for row in df.itertuples():
        assert bytes(row.image) == env.image(tasks[row.task_id])  # the picture this episode saw
        assert list(row.prompt_ids[: len(prefix)]) == prefix
    train = json.loads((it / "train" / "_manifest.json").read_text())["metrics"]
    assert train["logprob_mismatch_max"] < 1e-4  # the trainer saw the same pixels as the engine
    evals = json.loads((it / "evaluate" / "_manifest.json").read_text())["metrics"]
    assert {"accuracy_all", "accuracy_red", "pass@4"} <= set(evals)
    shown = run_cli(
        ["rollouts", "mm", "--iteration", "1", "-k", "2", "--json", "--images", str(tmp_path / "png")],
        tmp_path,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    best = json.loads(shown.stdout)["best"]
    assert len(best) == 2
    for row in best:
        png = Path(row["image"]).read_bytes()
        assert png == env.image(tasks[row["task_id"]])
    replayed_identical(tmp_path, "mm", 1, ["generate"])
