"""Arithmetic with verifiable answers: ``37+45=`` -> ``82``.

Several operations (add, sub, mul) and difficulty levels (operand digit counts). Problems are drawn from a
seeded generator; a problem is held-out or train by a hash of its text, so the two splits are disjoint
whatever their sizes. Single-turn: the first action ends the episode.

>>> env = ArithmeticEnv()
>>> env.reset({"prompt": "2+3=", "answer": "5"}, seed=0)
'2+3='
>>> env.step("5").outcome["correct"]
True
"""

from __future__ import annotations

import random
import re
from typing import Any

from envs.base import StepResult, is_heldout, register

_OPS = {"add": ("+", lambda a, b: a + b), "sub": ("-", lambda a, b: a - b), "mul": ("*", lambda a, b: a * b)}
# At most 64 digits: a longer "number" is not an answer (and int() of 4300+ digits raises).
_ANSWER = re.compile(r"^\s*(-?\d{1,64})\s*$")


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def problem_space_size(task_cfg: Any) -> int:
    total = 0
    for d in set(task_cfg.digits):
        n = 10**d - (0 if d == 1 else 10 ** (d - 1))
        total += n * n * len(set(task_cfg.operations))
    return total


def make_tasks(split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
    """Distinct problems of one split; deterministic in (seed, split, config)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want = task_cfg.train_size if split == "train" else task_cfg.heldout_size
    share = 0.1 if split == "heldout" else 0.9
    available = int(problem_space_size(task_cfg) * share * 0.9)
    if want > available:
        raise ValueError(
            f"task.{split}_size={want} exceeds the ~{available} distinct {split} problems of "
            f"operations={task_cfg.operations} digits={task_cfg.digits}"
        )
    rng = random.Random(f"{seed}:{split}")
    ops = sorted(set(task_cfg.operations))
    levels = sorted(set(task_cfg.digits))
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    while len(out) < want:
        op, d = rng.choice(ops), rng.choice(levels)
        a, b = _operand(rng, d), _operand(rng, d)
        sym, fn = _OPS[op]
        prompt = f"{a}{sym}{b}="
        if prompt in seen or is_heldout(prompt) != (split == "heldout"):
            continue
        seen.add(prompt)
        out.append(
            {
                "task_id": f"{split}-{len(out)}",
                "prompt": prompt,
                "answer": str(fn(a, b)),
                "op": op,
                "digits": d,
            }
        )
    return out


def digit_match(predicted: str, answer: str) -> float:
    """Share of right-aligned character positions (digits and sign) where the prediction matches the answer.

    >>> digit_match("128", "130"), digit_match("130", "130"), digit_match("", "7")
    (0.3333333333333333, 1.0, 0.0)
    """
    if not predicted:
        return 0.0
    width = max(len(predicted), len(answer))
    return sum(a == b for a, b in zip(predicted.rjust(width), answer.rjust(width), strict=True)) / width


def parse_answer(completion: str) -> int | None:
    """The integer the model answered, or None when the completion is not a bare integer."""
    m = _ANSWER.match(completion)
    return int(m.group(1)) if m else None


@register("arithmetic")
class ArithmeticEnv:
    name = "arithmetic"

    def __init__(self) -> None:
        self._task: dict[str, Any] | None = None

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        return make_tasks(split, task_cfg, seed)

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task = task
        return task["prompt"]

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        value = parse_answer(action)
        outcome = {
            "parsed": "" if value is None else str(value),
            "well_formed": value is not None,
            "correct": value is not None and str(value) == self._task["answer"],
            "digit_match": 0.0 if value is None else digit_match(str(value), self._task["answer"]),
        }
        return StepResult(observation=None, done=True, outcome=outcome)
