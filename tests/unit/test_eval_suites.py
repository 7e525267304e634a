"""Evaluation suites by name: which held-out problems each holds and what it reports (no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rl_core.evaluation.evaluate import mean_reward, sample_rewards, suite_metrics, suite_rows
from rl_core.schema.config import ConfigError, EvalSuite, load_config

TASKS = [{"task_id": f"h{i}", "op": op, "digits": d} for i, (op, d) in enumerate(
    [("add", 1), ("sub", 2), ("add", 2), ("mul", 1), ("add", 2)])]  # fmt: skip


def test_a_suite_is_the_problems_its_filter_names_in_order():
    assert suite_rows("adds", EvalSuite(filter={"op": ["add"]}), TASKS) == [0, 2, 4]
    assert suite_rows("hard", EvalSuite(filter={"op": ["add", "sub"], "digits": ["2"]}), TASKS) == [1, 2, 4]
    assert suite_rows("hard2", EvalSuite(filter={"digits": ["2"]}, size=2), TASKS) == [1, 2]
    assert suite_rows("all", EvalSuite(), TASKS) == [0, 1, 2, 3, 4]


def test_a_suite_that_matches_nothing_is_an_error_naming_it_and_the_fields():
    with pytest.raises(ValueError, match=r"eval.suites.divs: no held-out problem matches .*'digits', 'op'"):
        suite_rows("divs", EvalSuite(filter={"op": ["div"]}), TASKS)
    with pytest.raises(ValueError, match=r"eval.suites.typo"):
        suite_rows("typo", EvalSuite(filter={"opp": ["add"]}), TASKS)


def test_suite_metrics_are_the_suites_rows_alone():
    table = pd.DataFrame({"greedy_correct": [True, False, True, False], "samples_correct": [4, 0, 2, 1]})
    m = suite_metrics("adds", table.iloc[[0, 2]], samples=4, pass_k=[1, 4])
    assert m == {
        "suite.adds.accuracy": 1.0,
        "suite.adds.problems": 2,
        "suite.adds.pass@1": 0.75,
        "suite.adds.pass@4": 1.0,
    }


def test_suites_come_from_the_config_and_bad_names_are_refused():
    cfg = load_config("configs/smoke.yaml", ["eval.suites={adds: {filter: {op: [add]}}, first8: {size: 8}}"])
    assert list(cfg.eval.suites) == ["adds", "first8"] and cfg.eval.suites["first8"].size == 8
    with pytest.raises(ConfigError, match="eval.suites"):
        load_config("configs/smoke.yaml", ["eval.suites={../x: {}}"])
    with pytest.raises(ConfigError, match=r"eval.suites.adds.size"):
        load_config("configs/smoke.yaml", ["eval.suites={adds: {size: 0}}"])


def test_mean_reward_weights_each_problem_by_its_rewarded_samples():
    table = pd.DataFrame(
        {
            "greedy_correct": [True, False, True],
            "samples_correct": [2, 0, 1],
            "samples_reward": [1.0, 0.0, float("nan")],
            "samples_rewarded": [3, 1, 0],
        }
    )
    assert mean_reward(table) == 0.75
    m = suite_metrics("two", table.iloc[[1, 2]], samples=4, pass_k=[1])
    assert m["suite.two.mean_reward"] == 0.0
    assert np.isnan(mean_reward(table.iloc[[2]]))


def test_sampled_completions_are_scored_with_the_runs_reward_weights():
    """The evaluation's rewards are score_rewards' combination: the weighted components, NaN where a sample
    could not be scored (an infrastructure failure)."""
    cfg = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, format: 0.5}"])
    sampled = pd.DataFrame(
        {
            "prompt_index": [0, 0, 1],
            "prompt": ["1+1=", "1+1=", "2+2="],
            "completion_text": ["2", "3", "4"],
            "finish_reason": ["stop", "length", "stop"],
        }
    )
    outcomes = pd.DataFrame(
        {
            "prompt_index": [0, 0, 1],
            "sample_index": [0, 1, 0],
            "correct": [True, False, True],
            "well_formed": [True, True, True],
            "infra_error": [None, None, "sandbox: supervisor died"],
        }
    )
    got = sample_rewards(SimpleNamespace(cfg=cfg), sampled, outcomes, 1)
    assert got[0] == 1.5 and got[1] == 0.0 and np.isnan(got[2])
