"""The curriculum sampler (rl_core/generation/curriculum.py): weights worked by hand, the cooldown of groups
without a learning signal, the prior of unseen tasks, the weighted draw, the state update, and where the stage
table
puts its state in the schedule."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rl_core.generation.curriculum import STATE_DTYPES, draw, empty_state, update, weights
from rl_core.pipeline.stages import ITERATION_STAGES, STAGES, resolve_inputs
from rl_core.schema.config import load_config
from rl_core.schema.overrides import ConfigError
from tests.unit.test_stages import _lookup, _uris


def _task(i: int, op: str, digits: int) -> dict:
    return {"task_id": f"train-{i}", "prompt": f"p{i}", "answer": "0", "op": op, "digits": digits}


TASKS = [
    _task(0, "add", 1),
    _task(1, "add", 1),
    _task(2, "sub", 2),
    _task(3, "sub", 2),
    _task(4, "add", 1),
    _task(5, "mul", 2),
    _task(6, "sub", 2),
]


def _state(rows: list[tuple]) -> pd.DataFrame:
    """(task_id, last_seen, last_samples, last_successes, last_signal) rows, one visit each."""
    recs = [
        {
            "task_id": t,
            "visits": 1,
            "samples": n,
            "successes": c,
            "last_seen": k,
            "last_samples": n,
            "last_successes": c,
            "last_signal": sig,
        }
        for t, k, n, c, sig in rows
    ]
    return pd.DataFrame(recs, columns=list(STATE_DTYPES)).astype(STATE_DTYPES)


STATE = _state(
    [
        ("train-0", 3, 4, 4, False),  # all solved at 3: out of the pool until 3 + cooldown
        ("train-1", 2, 4, 0, False),  # all failed at 2: back (like an unseen task) after the cooldown
        ("train-2", 4, 4, 2, True),  # the frontier
        ("train-3", 4, 4, 1, True),
    ]
)


def test_weights_worked_by_hand():
    w = weights(TASKS, STATE, iteration=5, n=4, cooldown=2, window=2, keys=["op", "digits"])
    # window 2 at iteration 5: groups last seen at 3 or 4 -> train-0 (no signal), train-2, train-3 (signal)
    overall = (2 + 1) / (3 + 2)  # 0.6
    add1 = (0 + overall) / (1 + 1)  # 0.3: its one recent group had no signal
    sub2 = (2 + overall) / (2 + 1)
    mul2 = (0 + overall) / (0 + 1)  # no group of this kind yet: the overall share
    frontier = 1 - 2 * 0.5**4  # p = (2 + 1) / (4 + 2) = 0.5
    third = 1 - (1 / 3) ** 4 - (2 / 3) ** 4  # p = (1 + 1) / 6: 64 / 81
    expected = [0.0, add1, frontier, third, add1, mul2, sub2]
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-12)
    assert third == pytest.approx(64 / 81) and add1 == pytest.approx(0.3)


def test_the_cooldown_ends_and_one_kind_without_keys():
    # iteration 6: train-0 (seen at 3) has waited 3 > 2 iterations; window 2 keeps groups seen at 4 and 5
    w = weights(TASKS, STATE, iteration=6, n=4, cooldown=2, window=2, keys=[])
    overall = (2 + 1) / (2 + 2)  # train-2 and train-3 only, both with a signal
    prior = (2 + overall) / (2 + 1)
    assert w[0] == pytest.approx(prior) and w[1] == pytest.approx(prior) and w[5] == pytest.approx(prior)
    assert w[2] == pytest.approx(0.875)
    # with no cooldown a group without signal never leaves the pool; a long one keeps train-1 out too
    assert weights(TASKS, STATE, 5, 4, cooldown=0, window=2, keys=[])[0] > 0
    assert weights(TASKS, STATE, 5, 4, cooldown=10, window=2, keys=[])[[0, 1]].tolist() == [0.0, 0.0]


def test_first_iteration_is_uniform_and_bad_inputs_are_named():
    w = weights(TASKS, empty_state(), iteration=1, n=8, cooldown=4, window=4, keys=["op"])
    assert w.tolist() == [0.5] * len(TASKS)  # no data: (0 + 1) / (0 + 2) for every kind
    with pytest.raises(ValueError, match=r"rollout.curriculum_keys: the tasks have no field 'level'"):
        weights(TASKS, empty_state(), 1, 8, 4, 4, keys=["level"])
    stray = _state([("heldout-3", 1, 4, 2, True)])
    with pytest.raises(ValueError, match="not training tasks"):
        weights(TASKS, stray, 2, 8, 4, 4, keys=[])


def test_draw_is_deterministic_and_skips_weight_zero_while_it_can():
    w = np.array([0.0, 1.0, 0.5, 0.0, 2.0, 1.0])
    a = draw(w, 4, seed=123)
    assert a == draw(w, 4, seed=123) and len(set(a)) == 4
    assert set(a) == {1, 2, 4, 5}  # exactly the positive ones
    assert any(draw(w, 4, seed=s) != a for s in range(1, 20))  # the order depends on the seed
    full = draw(w, 6, seed=123)
    assert sorted(full) == list(range(6)) and set(full[:4]) == {1, 2, 4, 5}  # zero weights fill the rest
    with pytest.raises(ValueError, match=r"rollout.prompts_per_iteration=7 exceeds the 6 training tasks"):
        draw(w, 7, seed=1)


def test_draw_follows_the_weights():
    """The first draw is index i with probability w_i / sum(w) (Efraimidis-Spirakis): 4000 seeds, each
    frequency within 0.03 (about 4 standard deviations) of 0.1, 0.2, 0.3, 0.4; with all weights equal a
    draw of 2 of 4 hits each pair about equally often."""
    w = np.array([1.0, 2.0, 3.0, 4.0])
    first = np.bincount([draw(w, 1, seed=s)[0] for s in range(4000)], minlength=4) / 4000
    np.testing.assert_allclose(first, [0.1, 0.2, 0.3, 0.4], atol=0.03)
    pairs = pd.Series([tuple(sorted(draw(np.ones(4), 2, seed=s))) for s in range(3000)]).value_counts()
    assert len(pairs) == 6 and pairs.min() > 3000 / 6 * 0.8


def test_update_counts_groups_and_their_signal():
    rollouts = pd.DataFrame(
        {"prompt_index": [0, 0, 1, 1, 2, 2], "task_id": ["train-5"] * 2 + ["train-2"] * 2 + ["train-9"] * 2}
    )
    rewards = pd.DataFrame(
        {
            "prompt_index": [0, 0, 1, 1, 2, 2],
            "correct": [1.0, 1.0, 0.0, 1.0, 0.0, 0.0],
            "reward": [1.1, 1.1, 0.1, 1.1, math.nan, math.nan],  # train-9: every reward abstained
        }
    )
    before = _state([("train-2", 1, 4, 0, False)])
    new, groups = update(before, rollouts, rewards, iteration=3)
    assert new.to_dict("records") == [
        {
            "task_id": "train-2",
            "visits": 2,
            "samples": 6,
            "successes": 1,
            "last_seen": 3,
            "last_samples": 2,
            "last_successes": 1,
            "last_signal": True,
        },
        {
            "task_id": "train-5",
            "visits": 1,
            "samples": 2,
            "successes": 2,
            "last_seen": 3,
            "last_samples": 2,
            "last_successes": 2,
            "last_signal": False,
        },
        {
            "task_id": "train-9",
            "visits": 1,
            "samples": 2,
            "successes": 0,
            "last_seen": 3,
            "last_samples": 2,
            "last_successes": 0,
            "last_signal": False,
        },
    ]
    assert dict(new.dtypes.astype(str)) == STATE_DTYPES
    assert groups["signal"].tolist() == [True, False, False]
    with pytest.raises(ValueError, match="do not line up"):
        update(before, rollouts, rewards.iloc[::-1], iteration=3)


def test_the_state_in_the_schedule():
    """generate k reads the curriculum state of k-1 whatever rollout.max_staleness is: the curriculum stage
    runs before train, so state k-1 is committed when train k-1 starts, which is when an asynchronous run
    submits generate k. Without the curriculum nothing changes: no input, no stage."""
    plain = load_config("configs/smoke.yaml")
    assert "curriculum" in ITERATION_STAGES and not STAGES["curriculum"].due(plain, 1)
    everything = {("init", 0), ("warmup", 0)} | {(s, k) for s in ITERATION_STAGES for k in (1, 2, 3)}
    assert set(resolve_inputs(STAGES["generate"], plain, 3, _lookup(everything))) == {"policy"}
    for staleness in (0, 1, 2):
        cfg = load_config(
            "configs/smoke.yaml", ["rollout.curriculum=frontier", f"rollout.max_staleness={staleness}"]
        )
        assert STAGES["curriculum"].due(cfg, 1)
        for k in (1, 2, 3, 4):
            # committed when generate k starts: iteration k-1 up to its curriculum stage, and train up to
            # k-2 when asynchronous (k-1 when not)
            before = {"generate", "execute_envs", "score_rewards", "curriculum"}
            committed = {("init", 0), ("warmup", 0)} | {(s, j) for s in before for j in range(1, k)}
            committed |= {("train", j) for j in range(1, k - 1 if staleness else k)}
            got = _uris(resolve_inputs(STAGES["generate"], cfg, k, _lookup(committed)))
            assert got.get("curriculum") == (f"curriculum@{k - 1}/state" if k > 1 else None)
        assert _uris(resolve_inputs(STAGES["curriculum"], cfg, 1, _lookup(everything))) == {
            "rollouts": "generate@1/rollouts",
            "rewards": "score_rewards@1/rewards",
        }
        assert _uris(resolve_inputs(STAGES["curriculum"], cfg, 3, _lookup(everything)))["state"] == (
            "curriculum@2/state"
        )


def test_the_options_are_checked():
    with pytest.raises(ConfigError, match=r"rollout.curriculum"):
        load_config("configs/smoke.yaml", ["rollout.curriculum=easy"])
    with pytest.raises(ConfigError, match=r"rollout.curriculum_window"):
        load_config("configs/smoke.yaml", ["rollout.curriculum_window=0"])
    with pytest.raises(ConfigError, match=r"rollout.curriculum_cooldown"):
        load_config("configs/smoke.yaml", ["rollout.curriculum_cooldown=-1"])
