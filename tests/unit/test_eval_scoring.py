"""What the evaluate stage counts as scored and correct (rl_core/evaluation/evaluate.py), on stubbed engine
outputs and environment outcomes (no engine): an infrastructure failure is left out of accuracy and pass@k
and counted, a completion cut off by max_tokens is wrong and counted, and pass@k refuses k > n."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

import rl_core.evaluation.evaluate as ev
from rl_core.artifacts.stage import StageJob
from rl_core.schema.config import load_config

LOST = "sandbox: its supervisor was lost"


def _row(i: int, k: int, finish: str = "stop") -> dict:
    return {"prompt_index": i, "sample_index": k, "task_id": f"heldout-{i}", "prompt": f"p{i}",
            "completion_text": "ok", "finish_reason": finish}  # fmt: skip


def _evaluate(monkeypatch, n_tasks: int, samples: int, outcome, finish=lambda i, k, greedy: "stop"):
    """evaluate_body's metrics and table, its engine and environments stubbed: ``outcome(i, k, greedy)`` is
    each completion's environment result, ``finish`` its finish_reason."""
    cfg = load_config(
        "configs/smoke.yaml",
        [f"eval.samples={samples}", f"eval.pass_k=[1,{samples}]", "eval.mean_reward=false"],
    )
    tasks = [
        {"task_id": f"heldout-{i}", "prompt": f"p{i}", "answer": "a", "op": "add"} for i in range(n_tasks)
    ]

    def sample_table(ctx, policy, tasks_, spec, seeds, it):
        greedy = spec.n == 1  # (a column of the stub's: which table the outcomes are of)
        rows = [_row(i, k, finish(i, k, greedy)) for i in range(n_tasks) for k in range(spec.n)]
        return pd.DataFrame(rows).assign(greedy=greedy)

    def env_outcomes(ctx, df):
        return pd.DataFrame(
            [
                {
                    "prompt_index": r.prompt_index,
                    "sample_index": r.sample_index,
                    **outcome(r.prompt_index, r.sample_index, r.greedy),
                }  # fmt: skip
                for r in df.itertuples()
            ]
        )

    monkeypatch.setattr(ev, "sample_table", sample_table)
    monkeypatch.setattr(ev, "env_outcomes", env_outcomes)
    tables = {}
    store = SimpleNamespace(write_table=lambda uri, t: tables.setdefault("eval", t))
    ctx = SimpleNamespace(cfg=cfg, heldout_tasks=tasks, store=store)
    res = ev.evaluate_body(ctx, StageJob(1, {"policy": None}, "mem://eval"))
    return res.metrics, tables["eval"]


def _ok(correct=True):
    return {"correct": correct, "well_formed": True, "infra_error": None}


def _lost():
    return {"correct": False, "well_formed": False, "infra_error": LOST}


def test_without_failures_or_cut_offs_the_metrics_are_the_plain_ones(monkeypatch):
    # problem i's samples: the first i of 4 correct; greedy right on the even problems
    m, _ = _evaluate(monkeypatch, 4, 4, lambda i, k, g: _ok(i % 2 == 0 if g else k < i))
    assert m["accuracy"] == 0.5 and m["accuracy_add"] == 0.5 and m["well_formed"] == 1.0
    assert m["pass@1"] == pytest.approx((0 + 0.25 + 0.5 + 0.75) / 4)
    assert m["pass@4"] == 0.75
    assert m["infra_failures"] == 0 and m["truncated"] == 0.0 and m["truncated_sampled"] == 0.0


def test_an_infrastructure_failure_is_left_out_and_counted_not_scored_wrong(monkeypatch):
    # every answer right; the sandbox lost on problems 2 and 3 (greedy and every sample)
    m, table = _evaluate(monkeypatch, 4, 4, lambda i, k, g: _lost() if i >= 2 else _ok())
    assert m["accuracy"] == 1.0 and m["pass@1"] == 1.0 and m["pass@4"] == 1.0
    assert m["infra_failures"] == 2 + 8
    assert table["greedy_scored"].tolist() == [True, True, False, False]
    assert table["samples_scored"].tolist() == [4, 4, 0, 0]


def test_a_problem_with_fewer_scored_samples_than_k_is_left_out_of_pass_at_k(monkeypatch):
    # problem 0: 3 of its 4 samples scored, all wrong; problem 1: every sample right
    def outcome(i, k, g):
        if g:
            return _ok()
        return _lost() if (i, k) == (0, 3) else _ok(i == 1)

    m, _ = _evaluate(monkeypatch, 2, 4, outcome)
    assert m["pass@1"] == 0.5  # problem 0 over its 3 scored samples (0), problem 1 (1)
    assert m["pass@4"] == 1.0  # problem 1 alone
    assert m["infra_failures"] == 1


def test_when_nothing_could_be_scored_the_metrics_are_nan_and_counted(monkeypatch):
    m, _ = _evaluate(monkeypatch, 3, 2, lambda i, k, g: _lost())
    for key in ("accuracy", "accuracy_add", "pass@1", "pass@2", "well_formed"):
        assert math.isnan(m[key]), key
    assert m["infra_failures"] == 3 + 6


def test_a_completion_cut_off_by_max_tokens_is_wrong_and_counted(monkeypatch):
    # every verdict correct; greedy cut off on problem 0, samples cut off on their first of 2
    def finish(i, k, greedy):
        return "length" if (greedy and i == 0) or (not greedy and k == 0) else "stop"

    m, table = _evaluate(monkeypatch, 4, 2, lambda i, k, g: _ok(), finish)
    assert m["accuracy"] == 0.75 and m["truncated"] == 0.25
    assert m["pass@1"] == 0.5 and m["pass@2"] == 1.0 and m["truncated_sampled"] == 0.5
    assert table["greedy_correct"].tolist() == [False, True, True, True]
    assert table["samples_truncated"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(("n", "k"), [(1, 2), (4, 8), (3, 0)])
def test_pass_at_k_refuses_k_outside_1_to_n_naming_both(n, k):
    with pytest.raises(ValueError, match=f"k={k}, n={n}"):
        ev.pass_at_k(n, 0, k)
