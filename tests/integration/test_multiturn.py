"""Multi-turn episodes through the real stages (vLLM, DeepSpeed): token-in/token-out transcripts, observation
tokens masked out of the loss, hermetic replay of the environment, bit-identical replay of generate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rl_core.generation.sampling import completion_text
from rl_core.models.model import load_tokenizer, stop_ids
from tests.conftest import replayed_identical, run_cli

SMALL = [
    "--set",
    "tracking.enabled=false",
    "--set",
    "experiment.iterations=1",
    "--set",
    "warmup.steps=40",
    "--set",
    "model.hidden_size=64",
    "--set",
    "model.num_layers=2",
    "--set",
    "rollout.prompts_per_iteration=8",
    "--set",
    "rollout.n=4",
    "--set",
    "task.train_size=400",
    "--set",
    "task.heldout_size=16",
    "--set",
    "eval.every=1",
    "--set",
    "warmup.examples=400",
]


@pytest.mark.slow
def test_tool_use_run_is_token_in_token_out(tmp_path):
    r = run_cli(["run", "configs/tooluse.yaml", "--run-id", "mt", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    it = tmp_path / "store" / "mt" / "iter-0001"
    df = pd.read_parquet(it / "generate" / "rollouts.parquet")
    gen = json.loads((it / "generate" / "_manifest.json").read_text())
    folder = Path(gen["inputs"]["policy"]["uri"].removeprefix("file://"))
    tok = load_tokenizer(folder)
    stop = set(stop_ids(folder, tok))
    assert (df["turns"] > 1).any(), "no episode went past one turn"
    for row in df.itertuples():
        ids, mask, lps = list(row.completion_ids), list(row.loss_mask), np.asarray(row.logprobs)
        runs: list[tuple[int, list[int]]] = []
        for t, m in zip(ids, mask, strict=True):
            if runs and runs[-1][0] == m:
                runs[-1][1].append(int(t))
            else:
                runs.append((int(m), [int(t)]))
        obs_runs = [r_ for m, r_ in runs if m == 0]
        model_runs = [r_ for m, r_ in runs if m == 1]
        # observation tokens are exactly the tokenized observations, in order; model turns are the actions,
        # as generated: their special tokens kept (a pad inside an answer is in it), the stop token left out
        assert obs_runs == [tok(o, add_special_tokens=False)["input_ids"] for o in row.observations]
        acted = [completion_text(tok, m, stop) for m in model_runs[: len(row.actions)]]
        assert acted == list(row.actions)
        assert (lps[np.asarray(mask) == 0] == 0).all() and (lps[np.asarray(mask) == 1] <= 0).all()
        assert len(model_runs) == row.turns
    env = pd.read_parquet(it / "execute_envs" / "env_results.parquet")
    assert not env["replay_mismatch"].any()  # the environment gave the same observations on replay
    train = json.loads((it / "train" / "_manifest.json").read_text())["metrics"]
    assert np.isfinite(train["loss"]) and train["logprob_mismatch_max"] < 1e-3
    replayed_identical(tmp_path, "mt", 1, ["generate"])
