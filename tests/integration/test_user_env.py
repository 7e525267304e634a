"""An environment and a reward function from the user's own package, outside the project: named by
``module:Class`` and by the entry points of an installed package, validated with the config, run inline, in
the process pool and on Ray workers (which are sent the package), scored by the user's reward function.

The package is written by the test into a temporary folder with a ``.dist-info`` beside it, which is what an
installed package looks like to ``importlib.metadata`` (its entry points are found the same way)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from rl_core.generation.outcomes import env_outcomes
from rl_core.run.context import RunContext
from rl_core.schema.config import ConfigError, load_config
from rl_core.scoring.rewards import advantages, combine, components, outcome_records
from tests.conftest import python_in_private_netns

PACKAGE = '''
"""Reverse a word: "rev abc=" -> "cba"."""
import random

from pydantic import BaseModel, Field

from envs.base import StepResult, draw_tasks


class ReverseOptions(BaseModel):
    length: int = Field(3, ge=2, le=6, description="Letters per word.")
    alphabet: str = Field("abcdef", min_length=2, description="Letters drawn from.")


class ReverseEnv:
    name = "reverse"
    config_model = ReverseOptions

    def __init__(self, options: ReverseOptions) -> None:
        self.options = options

    def tasks(self, split, task_cfg, seed):
        def draw(rng: random.Random) -> dict:
            word = "".join(rng.choice(self.options.alphabet) for _ in range(self.options.length))
            return {"prompt": f"rev {word}=", "answer": word[::-1]}

        return draw_tasks("reverse", split, task_cfg, seed, draw)

    def reset(self, task, seed):
        self.task = task
        return task["prompt"]

    def step(self, action):
        guess = action.strip()
        ok = guess.isalpha() and len(guess) == self.options.length
        return StepResult(None, True, {"correct": guess == self.task["answer"], "well_formed": ok,
                                       "pid": __import__("os").getpid()})


class NoVerdictEnv(ReverseEnv):
    def step(self, action):
        return StepResult(None, True, {"score": 1.0})  # no correct / well_formed


def brevity(prompt, completion, outcome):
    """Shorter is better, for well-formed answers only; abstains on the others."""
    return -len(completion) / 10 if outcome.well_formed else None


def wordy(prompt, completion, outcome):
    return "high"
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``userenvs`` in a folder outside the project, importable (on sys.path, as for spawned workers) and
    "installed": a dist-info declaring its environment and reward function as entry points."""
    site = tmp_path / "site"
    (site / "userenvs").mkdir(parents=True)
    (site / "userenvs" / "__init__.py").write_text(PACKAGE)
    info = site / "userenvs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userenvs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rlfoundry.envs]\nreverse = userenvs:ReverseEnv\n\n[rlfoundry.rewards]\nbrevity = userenvs:brevity\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return site


def _config(env: str, executor: str = "inline", *extra: str):
    return load_config(
        None,
        [
            f"task.env={env}",
            "task.env_args.length=4",
            "task.train_size=60",
            "task.heldout_size=10",
            f"task.executor={executor}",
            *extra,
        ],
    )


def _rows(ctx: RunContext) -> pd.DataFrame:
    rows = []
    for i, t in enumerate(ctx.train_tasks[:30]):
        wrong = t["answer"][:-1] + ("b" if t["answer"].endswith("a") else "a")  # well formed, one letter off
        for k, text in enumerate((t["answer"], wrong, "??", "abcdefgh")):
            rows.append(
                {
                    "prompt_index": i,
                    "sample_index": k,
                    "task_id": t["task_id"],
                    "prompt": t["prompt"],
                    "seed": 7 + i,
                    "completion_text": text,
                }
            )
    return pd.DataFrame(rows)


def test_user_env_is_validated_with_the_config(user_package):
    cfg = _config("userenvs:ReverseEnv")
    assert cfg.task.env_args == {"length": 4, "alphabet": "abcdef"}  # defaults filled in, stored
    assert _config("reverse").task.env_args == cfg.task.env_args  # the entry point names the same class
    with pytest.raises(ConfigError, match=r"task\.env_args\.length.*less than or equal to 6"):
        _config("reverse", "inline", "task.env_args.length=9")
    with pytest.raises(ConfigError, match=r"task\.env_args\.colour.*[Ee]xtra"):
        _config("reverse", "inline", "task.env_args.colour=red")
    with pytest.raises(ConfigError, match="cannot import module 'userenvz'"):
        _config("userenvz:ReverseEnv")
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        _config("userenvs:Nope")
    with pytest.raises(ConfigError, match="not a function of"):
        load_config(None, ["reward.weights.userenvs:ReverseOptions=1"])


def test_an_outcome_without_the_required_fields_is_refused(user_package, state_dir):
    ctx = RunContext(_config("userenvs:NoVerdictEnv"), "user-env")
    with pytest.raises(ValueError, match=r"'userenvs:NoVerdictEnv'.*correct: Field required"):
        env_outcomes(ctx, _rows(ctx))


def ray_outcomes_in_netns(out: str) -> None:
    """In a private network namespace: the outcomes on a local Ray cluster, to ``out`` (parquet)."""
    ctx = RunContext(_config("reverse", "ray"), "user-env")
    env_outcomes(ctx, _rows(ctx)).to_parquet(out)


@pytest.mark.slow
def test_user_env_runs_inline_in_processes_and_on_ray(user_package, state_dir, tmp_path):
    ctx = RunContext(_config("reverse", "inline"), "user-env")
    inline = env_outcomes(ctx, _rows(ctx))
    assert inline["correct"].tolist() == [True, False, False, False] * 30
    assert inline["well_formed"].tolist() == [True, True, False, False] * 30
    assert set(inline["pid"]) == {os.getpid()}
    ctx = RunContext(_config("reverse", "process"), "user-env")
    pooled = env_outcomes(ctx, _rows(ctx))
    ctx.held.close()
    assert os.getpid() not in set(pooled["pid"])  # really ran in the worker processes
    pdt.assert_frame_equal(inline.drop(columns="pid"), pooled.drop(columns="pid"))
    out = tmp_path / "ray.parquet"
    code = f"from tests.integration.test_user_env import ray_outcomes_in_netns as f; f({str(out)!r})"
    r = python_in_private_netns(code)
    assert r.returncode == 0, r.stderr[-3000:]
    on_ray = pd.read_parquet(out)
    assert os.getpid() not in set(on_ray["pid"])
    pdt.assert_frame_equal(inline.drop(columns="pid"), on_ray.drop(columns="pid"))


def test_user_reward_abstains_and_the_group_uses_the_given_rewards(user_package, state_dir):
    ctx = RunContext(_config("reverse", "inline", "reward.weights.brevity=1.0"), "user-env")
    df = _rows(ctx)
    env = env_outcomes(ctx, df)
    outcomes = outcome_records(env, pd.Series(["stop"] * len(df)))
    weights = ctx.cfg.reward.weights
    assert list(weights) == ["correct", "format", "brevity"]
    parts, _ = components(None, weights, df["prompt"].tolist(), df["completion_text"].tolist(), outcomes)
    assert np.isnan(parts["brevity"][2::4]).all() and np.isnan(parts["brevity"][3::4]).all()
    assert parts["brevity"][0] == pytest.approx(-0.4)
    reward = combine(weights, parts)
    # the malformed answers: correct and format said 0, brevity abstained -> 0, not NaN
    assert reward[:4] == pytest.approx([1.0 + 0.1 - 0.4, 0.1 - 0.4, 0.0, 0.0])
    only_brevity = combine({"brevity": 1.0}, {"brevity": parts["brevity"]})
    assert np.isnan(only_brevity[2]) and np.isnan(only_brevity[3])
    adv = advantages(only_brevity, df["prompt_index"].to_numpy(), scale_by_std=False)
    # the group's mean is over the two given rewards (both -0.4): both advantages 0, abstentions 0
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    given = np.array([1.0, np.nan, 0.0, np.nan])
    assert advantages(given, np.zeros(4, dtype=int), scale_by_std=False).tolist() == [0.5, 0.0, -0.5, 0.0]


def test_a_reward_function_that_returns_a_non_number_names_itself(user_package):
    from envs.base import Outcome

    ok = [Outcome(correct=True, well_formed=True)] * 2
    assert components(None, {"userenvs:brevity": 1.0}, ["p", "p"], ["x", "xy"], ok)[0][
        "userenvs:brevity"
    ].tolist() == [
        -0.1,
        -0.2,
    ]
    with pytest.raises(TypeError, match=r"reward function 'userenvs:wordy' returned 'high' for row 0"):
        components(None, {"userenvs:wordy": 1.0}, ["p"], ["x"], ok[:1])
