"""The computer-use environment: a form driven by click/type/scroll, success from the final state."""

from __future__ import annotations

import random
import string

from envs.base import make_env
from envs.computer import ComputerEnv
from rl_core.schema.config import TaskSection

TASK = {
    "task_id": "t",
    "prompt": "task: name=ada food=pie then submit\n",
    "answer": "submitted",
    "goal": {"name": "ada", "food": "pie"},
}


def test_filling_the_form_with_scrolling_succeeds():
    env = make_env("computer")
    first = env.reset(TASK, 0)
    assert first.startswith(TASK["prompt"]) and "[1] name: " in first and "button submit" not in first
    for a in ["click(1)", "type(ada)", "scroll(down)", "scroll(down)", "scroll(down)"]:
        r = env.step(a)
        assert not r.done and r.observation is not None
    assert "[2] food: " in r.observation and "[3] button submit" in r.observation
    env.step("click(2)")
    env.step("type(pie)")
    r = env.step("click(3)")
    assert r.done and r.outcome["correct"] and r.outcome["well_formed"]


def test_wrong_or_incomplete_forms_fail():
    env = ComputerEnv()
    env.reset(TASK, 0)
    for a in ["click(1)", "type(ada)", "scroll(down)", "scroll(down)", "scroll(down)", "click(3)"]:
        r = env.step(a)
    assert r.done and not r.outcome["correct"]  # food never set
    env.reset(TASK, 0)
    for a in ["click(2)", "type(oslo)", "click(1)", "type(ada)"]:
        env.step(a)
    for _ in range(3):
        env.step("scroll(down)")
    env.step("click(2)")
    env.step("type(pie)")
    assert not env.step("click(3)").outcome["correct"]  # an untouched field was changed


def test_bad_actions_are_error_observations():
    env = ComputerEnv()
    rng = random.Random(1)
    for _ in range(300):
        env.reset(TASK, 0)
        junk = "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 20)))
        for a in (junk, f"click({junk})", f"type({junk})", f"scroll({junk})", "type(ada)"):
            r = env.step(a)
            assert r.done or r.observation is not None
    env.reset(TASK, 0)
    assert env.step("type(ada)").observation.startswith("error: nothing focused")
    assert env.step("click(9)").observation.startswith("error: no element")
    for bad in ("click(" + "9" * 5000 + ")", "click(\u00b2)", "click(-1)", "click(1.0)"):
        assert env.step(bad).observation.startswith("error: no element"), bad


def test_demonstrations_succeed_unless_flawed_and_are_deterministic():
    env = ComputerEnv()
    tasks = env.tasks("train", TaskSection(env="computer", train_size=50, heldout_size=10), 0)
    for t in tasks:
        segs = env.demonstration(t, flawed=False)
        assert segs == env.demonstration(t, flawed=False)
        play = ComputerEnv()
        play.reset(t, 0)
        results = [play.step(text) for text, is_model in segs if is_model]
        assert results[-1].done and results[-1].outcome["correct"]
        bad = ComputerEnv()
        bad.reset(t, 0)
        results = [bad.step(text) for text, is_model in env.demonstration(t, flawed=True) if is_model]
        assert results[-1].done and not results[-1].outcome["correct"]
