"""Counting up: write every whole number from ``a`` to ``b``: ``17..21=`` -> ``17 18 19 20 21``.

A generation-heavy task whose answers really are long: every answer holds as many numbers as fit in ~126
answer tokens at one token per digit and per space (25 numbers of four digits: 125 tokens with the closing
EOS), so a run samples up to 128 tokens per completion (``configs/countup.yaml``). The numbers have
``task.env_args.digits`` digits (``[4]``, the default: 1000-9999, 8,976 problems, 896 of them held-out;
``[2]``: only 49 problems). A problem is held-out or train by a hash of its prompt
(``envs.base.draw_tasks``), so the splits are disjoint. The length is fixed so that a tiny model learns
where to stop within a short warm-up.

The warm-up imitates a flawed teacher (``demonstration``): with ``warmup.teacher_error_rate`` its answer stops
one number early, so imitation learns to end one number short most of the time while the full count keeps
real probability: RL against the verifier has to unlearn the early stop. Single-turn.

>>> env = CountUpEnv()
>>> task = {"prompt": "8..12=", "answer": "8 9 10 11 12"}
>>> env.reset(task, seed=0)
'8..12='
>>> env.step("8 9 10 11 12").outcome["correct"]
True
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envs.arithmetic import ArithmeticEnv
from envs.base import StepResult, draw_tasks


class CountUpOptions(BaseModel):
    """Countup's own options (``task.env_args``)."""

    model_config = ConfigDict(extra="forbid")

    digits: list[int] = Field(
        [4], min_length=1, description="Digit counts of the numbers counted (answers hold 126 tokens)."
    )


# Answer tokens (digits, spaces and the closing EOS) a problem may need at most: within a 128-token budget.
ANSWER_TOKENS = 126
# A bare run of numbers, each at most 6 digits (longer is not an answer), separated by single spaces.
_ANSWER = re.compile(r"^\s*(\d{1,6}(?: \d{1,6})*)\s*$")


def count_range(digits: list[int]) -> tuple[int, int, int]:
    """(lowest number, highest number, numbers per answer) of the problems over ``digits``.

    >>> count_range([4]), count_range([3]), count_range([1, 2])
    ((1000, 9999, 25), (100, 999, 31), (0, 99, 42))
    """
    low = 0 if min(digits) == 1 else 10 ** (min(digits) - 1)
    return low, 10 ** max(digits) - 1, ANSWER_TOKENS // (max(digits) + 1)  # a number: digits + space/EOS


def count_up(a: int, b: int) -> str:
    """The right answer.

    >>> count_up(98, 101)
    '98 99 100 101'
    """
    return " ".join(str(n) for n in range(a, b + 1))


def make_tasks(split: str, task_cfg: Any, seed: int, digits: list[int]) -> list[dict[str, Any]]:
    """Distinct problems of one split; deterministic in (seed, split, sizes, digits).

    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(train_size=5, heldout_size=3)
    >>> t = make_tasks("train", cfg, 0, [4])[0]
    >>> t["answer"] == count_up(t["start"], t["stop"]) and t["prompt"] == f"{t['start']}..{t['stop']}="
    True
    """
    low, high, n = count_range(digits)
    if high - low + 1 < n:
        raise ValueError(f"task.env_args.digits={digits}: fewer than {n} numbers to count")

    def draw(rng: random.Random) -> dict[str, Any]:
        a = rng.randint(low, high - n + 1)
        b = a + n - 1
        return {"prompt": f"{a}..{b}=", "answer": count_up(a, b), "op": "count", "start": a, "stop": b}

    return draw_tasks("countup", split, task_cfg, seed, draw)


def parse_numbers(completion: str) -> list[str] | None:
    """The numbers the model wrote, or None when the completion is not a space-separated run of numbers.

    >>> parse_numbers(" 7 8 9 "), parse_numbers("7  8"), parse_numbers("7,8")
    (['7', '8', '9'], None, None)
    """
    m = _ANSWER.match(completion)
    return m.group(1).split(" ") if m else None


def number_match(predicted: list[str], answer: list[str]) -> float:
    """Share of positions holding the right number, over the longer of the two lists (dense partial credit).

    >>> number_match(["1", "2", "3"], ["1", "2", "3", "4"]), number_match(["1", "3"], ["1", "2"])
    (0.75, 0.5)
    """
    width = max(len(predicted), len(answer))
    return sum(p == a for p, a in zip(predicted, answer, strict=False)) / width if width else 0.0


def teacher_answer(answer: str) -> str:
    """The flawed teacher's systematic mistake: it stops one number early.

    >>> teacher_answer("17 18 19")
    '17 18'
    """
    return answer.rsplit(" ", 1)[0]


def score(completion: str, answer: str) -> dict[str, Any]:
    """The verifier's outcome: well formed (a run of numbers), correct (every number, no more, no fewer) and
    the partial credit ``digit_match`` (``number_match``), under the names the reward stage reads.

    >>> score("8 9 10 11", "8 9 10 11 12")
    {'parsed': '8 9 10 11', 'well_formed': True, 'correct': False, 'digit_match': 0.8}
    """
    numbers, expected = parse_numbers(completion), answer.split(" ")
    return {
        "parsed": "" if numbers is None else " ".join(numbers),
        "well_formed": numbers is not None,
        "correct": numbers == expected,
        "digit_match": 0.0 if numbers is None else number_match(numbers, expected),
    }


class CountUpEnv(ArithmeticEnv):
    """Episodes are arithmetic's (one action ends them); the tasks, demonstrations and verifier are new."""

    name = "countup"
    config_model: type[BaseModel] = CountUpOptions

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        assert isinstance(self.options, CountUpOptions)
        return make_tasks(split, task_cfg, seed, self.options.digits)

    def demonstration(self, task: dict[str, Any], flawed: bool) -> list[tuple[str, bool]]:
        """The warm-up's (text, is_model_turn) segments: the prompt, then the teacher's answer."""
        return [(task["prompt"], False), (self.flawed(task) if flawed else task["answer"], True)]

    def flawed(self, task: dict[str, Any]) -> str:
        """The flawed teacher's answer: one number short (``teacher_answer``)."""
        return teacher_answer(task["answer"])

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        return StepResult(observation=None, done=True, outcome=score(action, self._task["answer"]))
