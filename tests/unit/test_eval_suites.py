"""Evaluation suites by name: which held-out problems each holds and what it reports (no engine)."""

from __future__ import annotations

import pandas as pd
import pytest

from rl_core.evaluation.evaluate import suite_metrics, suite_rows
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
