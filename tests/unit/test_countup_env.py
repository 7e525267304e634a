"""The counting-up environment (envs/countup.py): its doctests, the task generator (long answers, within the
token budget, reproducible), disjoint train/held-out splits, the scoring and the flawed teacher."""

from __future__ import annotations

import doctest

import pytest

import envs.countup
from envs.base import make_env, registered
from envs.countup import ANSWER_TOKENS, count_range, count_up
from rl_core.schema.config import load_config

CFG = load_config("configs/countup.yaml")


def test_doctests():
    result = doctest.testmod(envs.countup)
    assert result.attempted >= 8 and result.failed == 0


def test_registered_and_config_draws_its_sets():
    assert "countup" in registered()
    env = make_env("countup")
    assert len(env.tasks("train", CFG.task, 0)) == CFG.task.train_size
    assert len(env.tasks("heldout", CFG.task, 0)) == CFG.task.heldout_size


@pytest.mark.parametrize(
    ("digits", "size", "fewest_tokens"),
    [([4], 300, 125), ([3], 300, 124), ([3, 4], 300, 25 * 4), ([1, 2], 40, 10 * 2 + 32 * 3)],
)
def test_answers_are_long_and_fit_the_budget(digits, size, fewest_tokens):
    cfg = CFG.task.model_copy(update={"train_size": size, "heldout_size": 3})
    low, high, n = count_range(digits)
    for t in make_env("countup", {"digits": digits}).tasks("train", cfg, 0):
        numbers = t["answer"].split(" ")
        assert numbers == [str(k) for k in range(t["start"], t["stop"] + 1)] and len(numbers) == n
        assert low <= t["start"] <= t["stop"] <= high
        tokens = len(t["answer"]) + 1  # one token per digit and per space, plus EOS
        assert fewest_tokens <= tokens <= ANSWER_TOKENS


def test_too_few_numbers_is_refused():
    with pytest.raises(ValueError, match="fewer than"):
        make_env("countup", {"digits": [1]}).tasks("train", CFG.task, 0)


def test_splits_are_disjoint_and_reproducible():
    env = make_env("countup")
    train = env.tasks("train", CFG.task, 0)
    held = env.tasks("heldout", CFG.task, 0)
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in held}
    assert len({t["prompt"] for t in train}) == len(train)
    assert train == env.tasks("train", CFG.task, 0)
    assert train != env.tasks("train", CFG.task, 1)


def test_scoring():
    env = make_env("countup")
    task = {"prompt": "97..101=", "answer": count_up(97, 101)}

    def score(text: str) -> dict:
        env.reset(task, seed=0)
        return env.step(text).outcome

    assert score("97 98 99 100 101") == {
        "parsed": "97 98 99 100 101",
        "well_formed": True,
        "correct": True,
        "digit_match": 1.0,
    }
    early = score("97 98 99 100")  # the flawed teacher's answer: well formed, wrong, most of the credit
    assert early["well_formed"] and not early["correct"] and early["digit_match"] == 0.8
    late = score("97 98 99 100 101 102")
    assert not late["correct"] and late["digit_match"] == pytest.approx(5 / 6)
    skipped = score("97 98 100 101")
    assert not skipped["correct"] and skipped["digit_match"] == 0.4
    for bad in ("97,98", "97  98", "", "97 98 x", "1234567"):
        out = score(bad)
        assert not out["well_formed"] and not out["correct"] and out["digit_match"] == 0.0
    with pytest.raises(RuntimeError):
        make_env("countup").step("1 2")


def test_flawed_teacher_stops_one_early():
    env = make_env("countup")
    task = env.tasks("train", CFG.task, 0)[0]
    prompt, answer = env.demonstration(task, flawed=False)
    assert prompt == (task["prompt"], False) and answer == (task["answer"], True)
    _, (flawed, is_model) = env.demonstration(task, flawed=True)
    assert is_model and task["answer"] == f"{flawed} {task['stop']}"
