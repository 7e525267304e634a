"""The arithmetic task: deterministic, disjoint splits, robust answer parsing."""

import pytest

from envs.arithmetic import ArithmeticEnv, ArithmeticOptions, parse_answer
from envs.arithmetic import make_tasks as _make_tasks
from envs.base import make_env, registered
from rl_core.evaluation.evaluate import pass_at_k
from rl_core.schema.config import load_config


def make_tasks(split, task_cfg, seed):
    return _make_tasks(split, task_cfg, seed, ArithmeticOptions(**task_cfg.env_args))


def test_splits_disjoint_and_deterministic():
    cfg = load_config().task
    tr, ho = make_tasks("train", cfg, 0), make_tasks("heldout", cfg, 0)
    assert len(tr) == cfg.train_size and len(ho) == cfg.heldout_size >= 200
    assert not {t["prompt"] for t in tr} & {t["prompt"] for t in ho}
    assert make_tasks("heldout", cfg, 0) == ho
    assert make_tasks("heldout", cfg, 1) != ho


def test_answers_are_right():
    cfg = load_config(None, ["task.env_args.operations=[add,sub,mul]", "task.env_args.digits=[1,2,3]"]).task
    for t in make_tasks("train", cfg, 3)[:500]:
        a, b = t["prompt"][:-1].replace("*", " ").replace("+", " ").replace("-", " ", 1).split()
        want = {"add": int(a) + int(b), "sub": int(a) - int(b), "mul": int(a) * int(b)}[t["op"]]
        assert t["answer"] == str(want)
    assert {t["op"] for t in make_tasks("train", cfg, 3)} == {"add", "sub", "mul"}


def test_too_many_problems_is_a_clear_error():
    cfg = load_config(None, ["task.env_args.digits=[1]", "task.train_size=5000"]).task
    with pytest.raises(ValueError, match="train_size=5000"):
        make_tasks("train", cfg, 0)


@pytest.mark.parametrize(
    "text,value",
    [("46", 46), (" -7 ", -7), ("46abc", None), ("", None), ("4 6", None), ("--3", None), ("12\n", 12)],
)
def test_parse_answer(text, value):
    assert parse_answer(text) == value


def test_env_episode_and_registry():
    assert "arithmetic" in registered()
    env = make_env("arithmetic")
    assert isinstance(env, ArithmeticEnv)
    assert env.reset({"prompt": "9-12=", "answer": "-3"}, 0) == "9-12="
    r = env.step("-3")
    assert r.done and r.outcome == {"parsed": "-3", "well_formed": True, "correct": True, "digit_match": 1.0}
    wrong = env.step("3").outcome
    assert wrong["correct"] is False and wrong["digit_match"] == 0.5
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        make_env("nope")


def test_pass_at_k_matches_enumeration():
    from itertools import combinations

    n, c = 6, 2
    for k in (1, 2, 3):
        combos = list(combinations(range(n), k))
        brute = sum(any(i < c for i in s) for s in combos) / len(combos)
        assert pass_at_k(n, c, k) == pytest.approx(brute)
