"""The curriculum end to end (smoke config, HF engine, asynchronous, 3 iterations): its state is a committed
stage artifact that generate reads, a run killed in the curriculum stage and resumed draws the same prompts
and ends with the same weights as a run left alone, and generate and curriculum replay bit for bit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import replayed_identical, run_cli, show_json

ARGS = [
    "configs/smoke.yaml",
    *("--set", "rollout.engine=hf", "--set", "rollout.curriculum=frontier"),
    *("--set", "rollout.curriculum_keys=[op,digits]", "--set", "rollout.max_staleness=1"),
    *("--set", "experiment.iterations=3", "--set", "eval.every=3", "--set", "tracking.enabled=false"),
]


def _show(state: Path, run_id: str) -> dict:
    return show_json(state, run_id)


def _manifest(state: Path, run_id: str, k: int, stage: str) -> dict:
    return json.loads((state / "store" / run_id / f"iter-{k:04d}" / stage / "_manifest.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run left alone (``cur``), and one SIGKILLed while the curriculum stage of iteration 2 writes, then
    resumed (``cur-k``), in one state folder (they share the warmed-up base model)."""
    state = tmp_path_factory.mktemp("curriculum")
    r = run_cli(["run", *ARGS, "--run-id", "cur"], state)
    assert r.returncode == 0, r.stderr[-3000:]
    k = run_cli(["run", *ARGS, "--run-id", "cur-k"], state, env={"RLFOUNDRY_FAULT": "curriculum:outputs@2"})
    assert k.returncode == -signal.SIGKILL, (k.returncode, k.stderr[-2000:])
    assert not (state / "store" / "cur-k" / "iter-0002" / "curriculum" / "_manifest.json").exists()
    resumed = run_cli(["resume", "cur-k"], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return state


@pytest.mark.slow
def test_the_state_is_an_artifact_generate_reads(runs):
    alone = runs
    data = _show(alone, "cur")
    assert data["stages"] == [
        "generate",
        "execute_envs",
        "audit",
        "score_rewards",
        "curriculum",
        "train",
        "evaluate",
        "vitals",
    ]
    for k in (1, 2, 3):
        cur = _manifest(alone, "cur", k, "curriculum")
        assert set(cur["outputs"]) == {"state"} and cur["metrics"]["groups"] == 8
        assert ("state" in cur["inputs"]) == (k > 1)
        gen = _manifest(alone, "cur", k, "generate")
        if k == 1:
            assert set(gen["inputs"]) == {"policy"}
        else:  # state k-1, by sha256, though generate k ran beside train k-1
            assert (
                gen["inputs"]["curriculum"]
                == _manifest(alone, "cur", k - 1, "curriculum")["outputs"]["state"]
            )
    state2 = pd.read_parquet(alone / "store" / "cur" / "iter-0002" / "curriculum" / "state.parquet")
    assert len(state2) == 16 and state2["visits"].sum() == 16  # 8 groups at each of 2 iterations
    # a task whose group had no learning signal is out of the pool for curriculum_cooldown (4) iterations
    out = set(state2.loc[~state2["last_signal"], "task_id"])
    drawn3 = set(
        pd.read_parquet(alone / "store" / "cur" / "iter-0003" / "generate" / "rollouts.parquet").task_id
    )
    assert out and not out & drawn3


@pytest.mark.slow
def test_a_resumed_run_draws_the_same_prompts(runs):
    state = runs
    for k in (1, 2, 3):
        for stage, output in (("generate", "rollouts"), ("curriculum", "state")):
            a, b = _manifest(state, "cur", k, stage), _manifest(state, "cur-k", k, stage)
            assert a["outputs"][output]["sha256"] == b["outputs"][output]["sha256"], (k, stage)
    hashes = [[it["policy_sha256"] for it in _show(state, r)["iterations"]] for r in ("cur", "cur-k")]
    assert hashes[0] == hashes[1] and len(hashes[0]) == 3


@pytest.fixture(scope="module")
def replays(runs):
    """Iteration 3's generate (it read the state iteration 2's curriculum stage committed) and curriculum
    (it read that state and iteration 3's rewards), replayed by one process."""
    return replayed_identical(runs, "cur", 3, ["generate", "curriculum"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["generate", "curriculum"])
def test_replay_is_identical(replays, stage):
    assert replays[stage]["identical"] is True and replays[stage]["artifacts"]
