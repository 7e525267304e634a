"""reasoning-gym as environments (envs/reasoning_gym.py): any of its datasets gives seeded, disjoint train and
held-out tasks scored by its own ``score_answer`` on the text after the reasoning block; bad names and
generator options fail at config load naming the field. Through the whole loop: the smoke of
benchmarks/reasoning_gym_curve.py (tests/integration/test_benchmarks_smoke.py) and the benchmark itself."""

from __future__ import annotations

import json

import pytest

from envs.base import make_env
from rl_core.schema.config import ConfigError, load_config

ARITH = {
    "dataset": "basic_arithmetic",
    "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def _cfg(args: dict, *more: str):
    return load_config(
        None,
        [
            "task.env=reasoning_gym",
            f"task.env_args={json.dumps(args)}",
            "task.train_size=200",
            "task.heldout_size=20",
            *more,
        ],
    )


def _env(cfg):
    return make_env(cfg.task.env, cfg.task.env_args)


def test_train_and_heldout_are_seeded_and_disjoint():
    cfg = _cfg(ARITH)
    env = _env(cfg)
    train, held = env.tasks("train", cfg.task, 0), env.tasks("heldout", cfg.task, 0)
    assert len(held) == 20 and len(train) == 200  # held-out questions never trained on, train topped up
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in held}
    assert [t["prompt"] for t in env.tasks("train", cfg.task, 0)] == [t["prompt"] for t in train]
    assert [t["prompt"] for t in env.tasks("train", cfg.task, 1)] != [t["prompt"] for t in train]


def test_its_own_scorer_is_the_verifier_after_the_reasoning_block():
    cfg = _cfg(ARITH)
    env = _env(cfg)
    task = env.tasks("heldout", cfg.task, 0)[0]
    env.reset(task, 0)
    assert env.step(task["answer"]).outcome == {
        "correct": True,
        "well_formed": True,
        "score": 1.0,
        "refused": "",
    }
    assert env.step(f"<think>it could be {int(task['answer']) + 1}</think> {task['answer']}").outcome[
        "correct"
    ]
    assert not env.step(str(int(task["answer"]) + 1)).outcome["correct"]
    assert env.step("<think>never closed").outcome["well_formed"] is False
    # reasoning-gym's own convention: the last <answer> tag, when there is one
    wrong = str(int(task["answer"]) + 1)
    assert env.step(f"<think>x</think> so <answer>{task['answer']}</answer>").outcome["correct"]
    assert not env.step(f"<answer>{task['answer']}</answer> no, <answer>{wrong}</answer>").outcome["correct"]


# A spread of its families: arithmetic, algorithmic string tasks, logic, games.
DATASETS = [
    "chain_sum",
    "basic_arithmetic",
    "spell_backward",
    "letter_counting",
    "word_sorting",
    "gcd",
    "count_bits",
    "caesar_cipher",
]


@pytest.mark.parametrize("name", DATASETS)
def test_any_dataset_gives_tasks_its_scorer_accepts(name):
    cfg = _cfg({"dataset": name}, "task.train_size=20", "task.heldout_size=10")
    env = _env(cfg)
    tasks = env.tasks("train", cfg.task, 0)
    assert tasks and all(isinstance(t["prompt"], str) and t["prompt"] for t in tasks)
    for t in tasks[:5]:
        env.reset(t, 0)
        assert env.step(t["answer"]).outcome["correct"], (name, t["prompt"][:80], t["answer"])


def test_chat_prompts_are_one_user_message():
    cfg = _cfg({**ARITH, "prompt": "chat"})
    task = _env(cfg).tasks("train", cfg.task, 0)[0]
    assert task["prompt"] == [{"role": "user", "content": task["entry"]["question"]}]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            {"dataset": "no_such_dataset"},
            r"task\.env_args\.dataset: .*unknown reasoning_gym dataset 'no_such_dataset'",
        ),
        (
            {"dataset": "basic_arithmetic", "config": {"min_terms": "many"}},
            r"task\.env_args\.config for reasoning_gym",
        ),
        ({"dataset": "basic_arithmetic", "confg": {}}, r"task\.env_args\.confg"),
    ],
)
def test_bad_options_fail_at_load_naming_the_field(args, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(args)


@pytest.mark.parametrize(
    "dataset, answer, error",
    [("prime_factorization", "I am not sure", "ValueError"), ("boxnet", "[[1,2],[3]]", "AttributeError")],
)
def test_an_answer_its_scorer_raises_on_scores_0_not_an_error(dataset, answer, error):
    cfg = _cfg({"dataset": dataset})
    env = _env(cfg)
    task = env.tasks("heldout", cfg.task, 0)[0]
    env.reset(task, 0)
    for _ in range(2):  # deterministically
        assert env.step(answer).outcome == {
            "correct": False,
            "well_formed": False,
            "score": 0.0,
            "refused": f"scorer_raised: {error}",
        }
    if dataset == "prime_factorization":  # the gold answer still pays
        assert env.step(task["answer"]).outcome["correct"]
