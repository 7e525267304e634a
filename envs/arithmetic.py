"""Arithmetic with verifiable answers: ``37+45=`` -> ``82``.

Several operations (add, sub, mul) and difficulty levels (operand digit counts). Problems are drawn from a
seeded generator; a problem is held-out or train by a hash of its text, so the two splits are disjoint
whatever their sizes. Disjoint as texts, not as facts: a commuted twin (``2+8=`` of a held-out ``8+2=``, the
same sum) can be in training — an audit counted 70 of the default config's 256 held-out problems — so the
held-out accuracy measures arithmetic over seen facts partly, not only unseen ones. Kept so (the split of
the built-in task is what every pinned policy hash and committed curve was measured on); a task of your own
splits on what it means by "the same problem" (``envs.base.is_heldout`` of a canonical text). Single-turn:
the first action ends the episode.

>>> env = ArithmeticEnv(ArithmeticOptions(operations=["add"], digits=[1]))
>>> env.reset({"prompt": "2+3=", "answer": "5"}, seed=0)
'2+3='
>>> env.step("5").outcome["correct"]
True
"""

from __future__ import annotations

import random
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.base import StepResult, is_heldout


class ArithmeticOptions(BaseModel):
    """Arithmetic's own options (``task.env_args``)."""

    model_config = ConfigDict(extra="forbid")

    operations: list[Literal["add", "sub", "mul"]] = Field(
        ["add", "sub"], min_length=1, description="Arithmetic operations to draw problems from."
    )
    digits: list[Annotated[int, Field(ge=1, le=32)]] = Field(
        [1, 2],
        min_length=1,
        description="Difficulty levels: operand digit counts drawn from (1-32: a product of two 32-digit "
        "numbers has 64 digits, the longest answer read).",
    )


_OPS = {"add": ("+", lambda a, b: a + b), "sub": ("-", lambda a, b: a - b), "mul": ("*", lambda a, b: a * b)}
# At most 64 digits: a longer "number" is not an answer (and int() of 4300+ digits raises).
_ANSWER = re.compile(r"^\s*(-?\d{1,64})\s*$")


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def problem_space_size(options: ArithmeticOptions) -> int:
    total = 0
    for d in set(options.digits):
        n = 10**d - (0 if d == 1 else 10 ** (d - 1))
        total += n * n * len(set(options.operations))
    return total


def make_tasks(split: str, task_cfg: Any, seed: int, options: ArithmeticOptions) -> list[dict[str, Any]]:
    """Distinct problems of one split (``task_cfg`` gives the split sizes); deterministic in (seed, split,
    sizes, options)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want = task_cfg.train_size if split == "train" else task_cfg.heldout_size
    share = 0.1 if split == "heldout" else 0.9
    available = int(problem_space_size(options) * share * 0.9)
    if want > available:
        raise ValueError(
            f"task.{split}_size={want} exceeds the ~{available} distinct {split} problems of "
            f"task.env_args operations={options.operations} digits={options.digits}"
        )
    rng = random.Random(f"{seed}:{split}")
    ops = sorted(set(options.operations))
    levels = sorted(set(options.digits))
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


class ArithmeticEnv:
    name = "arithmetic"
    config_model: type[BaseModel] = ArithmeticOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options or self.config_model()
        self._task: dict[str, Any] | None = None

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        assert isinstance(self.options, ArithmeticOptions)
        return make_tasks(split, task_cfg, seed, self.options)

    def flawed(self, task: dict[str, Any]) -> str:
        """The warm-up teacher's systematic mistake: off by one.

        >>> ArithmeticEnv().flawed({"answer": "41"}), ArithmeticEnv().flawed({"answer": "-3"})
        ('42', '-2')
        """
        return str(int(task["answer"]) + 1)

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
