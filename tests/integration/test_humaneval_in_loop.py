"""HumanEval in the RL loop (a smoke run): the sandboxed HumanEval environment's outcomes carry what the
reward functions need, so generate -> execute_envs (every completion run against the problem's tests in the
sandbox) -> score_rewards -> train -> evaluate commits end to end. A model trained here cannot solve HumanEval
(the learning curve is the generated code tasks'); this checks the scoring path in the loop."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import cli, cli_env, show_json

HUMANEVAL_SMOKE = [
    "task.env=humaneval",
    "task.executor=inline",
    "experiment.iterations=1",
    "model.vocab_size=1024",
    "model.max_position=512",  # the longest HumanEval prompt is 466 tokens of this tokenizer
    "warmup.steps=0",
    "rollout.prompts_per_iteration=4",
    "rollout.n=2",
    "rollout.max_tokens=16",
    "eval.pass_k=[1]",
    "eval.samples=1",
    "tracking.enabled=false",
]


@pytest.mark.slow
def test_humaneval_runs_in_the_loop(tmp_path):
    env = cli_env(tmp_path / "state")
    args = ["run", "configs/smoke.yaml", "--run-id", "he-loop"]
    r = cli([*args, *(a for s in HUMANEVAL_SMOKE for a in ("--set", s))], env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    data = show_json(tmp_path / "state", "he-loop")
    it = data["iterations"][0]["stages"]
    assert all(it[s]["status"] == "committed" for s in ("execute_envs", "score_rewards", "train", "evaluate"))
    results = pd.read_parquet(it["execute_envs"]["artifacts"]["env_results"].removeprefix("file://"))
    assert len(results) == 8 and {"correct", "well_formed", "flags", "sandbox_s"} <= set(results.columns)
    # a random 1M-parameter model's completions never pass; each verdict says why (syntax, assertion, ...)
    assert not results["correct"].any() and all(len(f) > 0 for f in results["flags"])
    assert it["execute_envs"]["metrics"]["sandbox_s"] == pytest.approx(results["sandbox_s"].sum())
    rewards = pd.read_parquet(it["score_rewards"]["artifacts"]["rewards"].removeprefix("file://"))
    assert rewards["reward"].notna().all() and (rewards["correct"] == 0).all()
    # the audit ran on the completions (Python the grader runs: the code rules too) before they were scored
    assert it["audit"]["status"] == "committed"
    flags = pd.read_parquet(it["audit"]["artifacts"]["flags"].removeprefix("file://"))
    assert len(flags) == 8 and {"flags", "zeroed", "infra_error"} <= set(flags.columns)
    assert it["audit"]["metrics"]["zeroed"] == int(flags["zeroed"].sum())
    r = cli(["replay", "he-loop", "--iteration", "1", "--stage", "audit", "--json"], env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(r.stdout)["identical"] is True
