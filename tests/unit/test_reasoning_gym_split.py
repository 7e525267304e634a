"""reasoning-gym's held-out split (envs/reasoning_gym.py): the generator writes one problem several ways
(``Calculate -1 - -9.`` / ``Calculate ( -1 - -9 ).``) and repeats itself, so the split compares problems by
``item_key`` (question without whitespace, brackets or double minus, case-folded, and the gold answer): no
held-out problem is trained on under another spelling, none is held out twice, and the held-out size stays
as configured."""

from __future__ import annotations

import json
import re

import pytest

from envs.base import make_env
from envs.reasoning_gym import ReasoningGymEnv, item_key
from rl_core.schema.config import load_config

# configs/reasoning_gym.yaml's task, smaller
ARITH = {
    "dataset": "basic_arithmetic",
    "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def _cfg(train: int, heldout: int):
    return load_config(
        None,
        [
            "task.env=reasoning_gym",
            f"task.env_args={json.dumps(ARITH)}",
            f"task.train_size={train}",
            f"task.heldout_size={heldout}",
        ],
    )


def _spelling(task: dict) -> tuple[str, str]:
    """The question up to brackets and whitespace, and the answer (the audit's measure, independent of
    item_key)."""
    return re.sub(r"[()\s]", "", task["entry"]["question"]), task["answer"]


def test_no_held_out_problem_is_trained_on_under_another_spelling_or_held_out_twice():
    cfg = _cfg(2000, 200)
    env = make_env(cfg.task.env, cfg.task.env_args)
    train, held = env.tasks("train", cfg.task, 0), env.tasks("heldout", cfg.task, 0)
    assert len(held) == 200 and len(train) == 2000  # the sizes as configured
    assert len({_spelling(t) for t in held}) == 200  # no held-out problem twice
    assert not {_spelling(t) for t in train} & {_spelling(t) for t in held}
    assert not {item_key(t["entry"]) for t in train} & {item_key(t["entry"]) for t in held}
    assert [t["task_id"] for t in held] == [f"heldout-{i}" for i in range(200)]


def test_same_problem_means_same_question_up_to_spelling_and_same_answer():
    assert item_key({"question": "Calculate ( -1 - -9 ).", "answer": 8}) == item_key(
        {"question": "Calculate -1 - -9.", "answer": "8"}
    )
    assert item_key({"question": "Calculate -( -( 9 * 6 ) ).", "answer": 54}) == item_key(
        {"question": "CALCULATE 9 * 6.", "answer": 54}
    )
    # brackets that change the answer: another problem
    assert item_key({"question": "Calculate -( 2 - 3 ).", "answer": 1}) != item_key(
        {"question": "Calculate -2 - 3.", "answer": -5}
    )


def test_too_few_distinct_held_out_problems_is_an_error_naming_them(monkeypatch):
    cfg = _cfg(20, 10)
    env = make_env(cfg.task.env, cfg.task.env_args)
    same = [
        {"question": "Calculate 1 + 1.", "answer": "2"},
        {"question": "Calculate ( 1 + 1 ).", "answer": 2},
    ]
    monkeypatch.setattr(ReasoningGymEnv, "_items", lambda self, split, size, seed: (same * size)[:size])
    with pytest.raises(ValueError, match=r"only 1 distinct held-out questions among 80 drawn"):
        env.tasks("heldout", cfg.task, 0)
