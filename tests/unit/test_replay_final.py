"""A multi-turn episode's replay (rl_core.generation.outcomes.outcomes_for, the execute_envs stage) must end
where and as the generated episode ended (its rollout's ``final``), not only show the same observations: a
non-hermetic environment's last step (MiniWoB++ scored the same stored actions 1, 0, 1, 0 depending on what
its browser ran before) has no observation to compare, and its reward was whatever the replay drew."""

from __future__ import annotations

from typing import Any

import pytest

from envs.base import StepResult
from rl_core.generation.outcomes import final_of, outcomes_for

ENV = "tests.unit.test_replay_final:Scripted"


class Scripted:
    """An episode ends at step ``ends_at`` (1-based; 0: never), ``correct`` as the class says now."""

    correct = True
    ends_at = 1

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        return []

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self.steps = 0
        return "start"

    def step(self, action: str) -> StepResult:
        self.steps += 1
        if self.steps == type(self).ends_at:
            return StepResult(None, True, {"correct": type(self).correct, "well_formed": True})
        return StepResult(f"obs {self.steps}", False, {"correct": False, "well_formed": True})


@pytest.fixture(autouse=True)
def _reset_script() -> None:
    Scripted.correct, Scripted.ends_at = True, 1


def _row(actions: list[str], final: str | None) -> dict[str, Any]:
    row = {
        "prompt_index": 0,
        "sample_index": 0,
        "task_id": "t",
        "seed": 0,
        "actions": actions,
        "observations": [f"obs {i + 1}" for i in range(len(actions) - 1)],
        "turns": len(actions),
    }
    return row if final is None else {**row, "final": final}


def _replayed(row: dict[str, Any]) -> dict[str, Any]:
    return outcomes_for(ENV, {}, [row], {"t": {"task_id": "t"}})[0]


def test_the_same_end_is_no_mismatch() -> None:
    got = _replayed(_row(["a"], "correct"))
    assert got["done"] and got["correct"] and not got["replay_mismatch"]
    Scripted.ends_at = 0
    assert not _replayed(_row(["a", "b"], "open"))["replay_mismatch"]  # cut off at max_turns both times


def test_a_final_step_that_scores_otherwise_is_a_mismatch() -> None:
    Scripted.correct = False  # generated: correct; replayed: incorrect (or the other way)
    assert _replayed(_row(["a"], "correct"))["replay_mismatch"]
    Scripted.correct = True
    assert _replayed(_row(["a"], "incorrect"))["replay_mismatch"]


def test_an_episode_that_ends_elsewhere_is_a_mismatch() -> None:
    # generated: open after two actions (cut off); replayed: the first action ends it
    assert _replayed(_row(["a", "b"], "open"))["replay_mismatch"]
    # generated: ended by its last action; replayed: still open after it
    Scripted.ends_at = 0
    assert _replayed(_row(["a", "b"], "correct"))["replay_mismatch"]


def test_rows_stored_before_the_column_are_checked_as_before() -> None:
    Scripted.correct = False
    got = _replayed(_row(["a"], None))
    assert got["done"] and not got["correct"] and not got["replay_mismatch"]


def test_a_step_says_how_it_left_the_episode() -> None:
    assert final_of(StepResult(None, True, {"correct": 1.0})) == "correct"
    assert final_of(StepResult(None, True, {"correct": 0})) == "incorrect"
    assert final_of(StepResult("more", False, {"correct": True})) == "open"
