"""The tool-use environment: calculator, call parsing (never a crash), multi-turn episodes, determinism."""

from __future__ import annotations

import random
import string

import pandas as pd
import pytest
import torch

from envs.base import make_env
from envs.tools import CalcError, ToolUseEnv, calculate
from rl_core.schema.config import TaskSection
from rl_core.training.ppo import make_batch


def test_calculator_is_a_parser_not_eval():
    assert calculate("12*34+5") == 413 and calculate("(1+2)*-3") == -9 and calculate(" 7 ") == 7
    for bad in [
        "__import__('os').system('true')",
        "1/0",
        "2**100",
        "",
        "1+",
        "(1",
        "9" * 70,
        "99999999*99999999",
    ]:
        with pytest.raises(CalcError):
            calculate(bad)


def _task():
    return {"task_id": "t", "prompt": "Q:12*34+5\n", "answer": "413", "a": 12, "b": 34, "c": 5, "sign": "+"}


def test_episode_needs_several_turns_and_scores_the_answer():
    env = make_env("tooluse")
    assert env.reset(_task(), 0) == "Q:12*34+5\n"
    r = env.step("calc(12*34)")
    assert (r.observation, r.done) == ("=408\n", False)
    r = env.step("calc(408+5)")
    assert (r.observation, r.done) == ("=413\n", False)
    r = env.step("ans(413)")
    assert r.done and r.outcome["correct"] and r.outcome["calls"] == 2 and r.outcome["well_formed"]
    env.reset(_task(), 0)
    env.step("calc(12*34)")
    assert env.step("ans(408)").outcome["correct"] is False  # the flawed teacher's shortcut is wrong


def test_malformed_calls_get_error_observations_never_exceptions():
    env = ToolUseEnv()
    rng = random.Random(0)
    alphabet = string.printable + "()calcpyans"
    for _ in range(500):
        env.reset(_task(), 0)
        action = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        for a in (action, f"calc({action})", f"ans({action})"):
            r = env.step(a)
            assert r.done or r.observation.startswith(("=", "error:")), (a, r)
    for a in ("ans(" + "9" * 5000 + ")", "ans(\u00b2)", "calc(" + "9" * 5000 + ")", "ans(-)"):
        env.reset(_task(), 0)
        r = env.step(a)
        assert r.observation.startswith("error:") and not r.done, a
    env.reset(_task(), 0)
    r = env.step("calc(1+)")
    assert r.observation.startswith("error:") and not r.done and r.outcome["errors"] == 1
    env.reset(_task(), 0)  # a py call over the sandbox's disk: an error line, not the sandbox's ValueError
    r = env.step("py(" + "x = 1\n" * 300_000 + ")")
    assert r.observation.startswith("error: code longer") and not r.done


def test_python_tool_runs_in_the_sandbox():
    env = ToolUseEnv()
    env.reset(_task(), 0)
    assert env.step("py(print(12*34))").observation == "=408\n"
    r = env.step("py(open('/etc/passwd').read())")
    assert r.observation.startswith("error:") and "root" not in r.observation


def test_nothing_an_episode_writes_reaches_a_later_run():
    """Each tool call is a fresh sandbox run (its own /work and namespaces in a reused container), so
    what the policy plants during an episode (a sitecustomize, an edited file) is gone for the next call
    and for the grader."""
    env = ToolUseEnv()
    env.reset(_task(), 0)
    plant = "open('sitecustomize.py','w').write('print(1)');open('main.py','a').write('#');print('ok')"
    assert env.step(f"py({plant})").observation == "=ok\n"
    r = env.step("py(import os;print(sorted(os.listdir('.')), open('main.py').read()[-1:] == '#'))")
    assert r.observation == "=['main.py'] False\n", r.observation


def test_same_actions_same_observations():
    actions = ["calc(12*34)", "nonsense", "calc(408+5)", "ans(413)"]

    def play():
        env = make_env("tooluse")
        env.reset(_task(), 7)
        return [(r.observation, r.done, r.outcome) for r in (env.step(a) for a in actions)]

    assert play() == play()


def test_tasks_are_deterministic_and_splits_disjoint():
    cfg = TaskSection(env="tooluse", train_size=300, heldout_size=50)
    env = ToolUseEnv()
    a, b = env.tasks("train", cfg, 0), env.tasks("train", cfg, 0)
    assert a == b and len(a) == 300
    held = env.tasks("heldout", cfg, 0)
    assert not {t["prompt"] for t in a} & {t["prompt"] for t in held}
    assert all(str(t["a"] * t["b"] + (t["c"] if t["sign"] == "+" else -t["c"])) == t["answer"] for t in a)


def test_observation_tokens_carry_no_loss():
    # prompt 3 tokens; completion: 2 model tokens, 2 observation tokens, 1 model token
    df = pd.DataFrame(
        {
            "prompt_ids": [[5, 6, 7]],
            "completion_ids": [[10, 11, 20, 21, 12]],
            "logprobs": [[-0.5, -0.25, 0.0, 0.0, -1.0]],
            "loss_mask": [[1, 1, 0, 0, 1]],
            "advantage": [1.0],
        }
    )
    b = make_batch(df, pad_id=0)
    # target positions 2..6 hold the completion tokens; observation targets (positions 4, 5) are masked out
    assert b.loss_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert torch.equal(b.rollout_logp[0], torch.tensor([0, 0, -0.5, -0.25, 0, 0, -1.0]))


def test_the_python_tool_has_a_fixed_hash_seed():
    """A printed set or hash() depends on the hash seed: a random one made an honest episode's replay differ
    (``replay_mismatch``, scored at the floor). The py tool's Python runs with PYTHONHASHSEED=0."""
    import subprocess

    code = "print(hash('rlfoundry'), sorted({'apple', 'banana'}) == ['apple', 'banana'])"
    seeded = subprocess.run(
        ["/usr/bin/python3", "-c", code], env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True
    ).stdout
    env = ToolUseEnv()
    env.reset(_task(), 0)
    assert env.step(f"py({code})").observation == "=" + seeded.strip() + "\n"
