"""Computer use as text: a simulated form on a small screen, driven with click / type / scroll actions.

The screen shows three rows of a five-field form at a time plus a Submit button at the end, as text (each
visible element numbered). A task asks to set two fields and submit. Kept beside computer use from pixels
(``envs/miniwob.py``) as the long multi-turn text workload: up to 10 turns and 640 tokens an episode, with
scrolling; it has no picture (its PNG rendering, which no policy read, was removed). Actions, one per turn:

- ``click(N)``: focus the visible element numbered N (or press it, for the button);
- ``type(TEXT)``: replace the focused field's value with TEXT;
- ``scroll(down)`` / ``scroll(up)``: move the viewport by one row.

An action that is not one of these, or that makes no sense on this screen (a number not shown, typing with
nothing focused), gets an ``error: ...`` observation; the episode goes on. Pressing Submit ends it; success is
read from the final state: submitted, and every requested field holds its value (other fields untouched).

    env = ComputerEnv()
    screen = env.reset(task, seed=0)
    env.step("click(1)"); env.step("type(Ada)"); ...
"""

from __future__ import annotations

import random
import re
from typing import Any

from envs.base import StepResult, draw_tasks

FIELDS = ["name", "city", "color", "pet", "food"]
VALUES = {
    "name": ["ada", "bob", "cy", "dee", "eve", "fay"],
    "city": ["oslo", "rome", "lima", "kyiv", "pune"],
    "color": ["red", "blue", "green", "gold", "gray"],
    "pet": ["cat", "dog", "owl", "fox", "yak"],
    "food": ["rice", "soup", "pie", "taco", "kiwi"],
}
VIEW = 3
_ACTION = re.compile(r"^\s*(click|type|scroll)\((.*)\)\s*$", re.S)


class ComputerEnv:
    name = "computer"
    max_turns = 10

    def __init__(self) -> None:
        self._task: dict[str, Any] | None = None

    # -- tasks ------------------------------------------------------------------------------------------
    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        def draw(rng: random.Random) -> dict[str, Any]:
            f1, f2 = sorted(rng.sample(range(len(FIELDS)), 2))
            goal = {FIELDS[f1]: rng.choice(VALUES[FIELDS[f1]]), FIELDS[f2]: rng.choice(VALUES[FIELDS[f2]])}
            prompt = "task: " + " ".join(f"{k}={v}" for k, v in goal.items()) + " then submit\n"
            return {"prompt": prompt, "answer": "submitted", "goal": goal}

        return draw_tasks("computer", split, task_cfg, seed, draw)

    # -- state ------------------------------------------------------------------------------------------
    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task = task
        self.values = dict.fromkeys(FIELDS, "")
        self.top = 0
        self.focus: str | None = None
        self.submitted = False
        self.errors = 0
        return task["prompt"] + self.render()

    def _elements(self) -> list[str]:
        return [*FIELDS, "submit"][self.top : self.top + VIEW]

    def render(self) -> str:
        """The visible screen as text, one numbered element per line."""
        lines = []
        for i, el in enumerate(self._elements(), 1):
            if el == "submit":
                lines.append(f"[{i}] button submit")
            else:
                mark = "*" if self.focus == el else " "
                lines.append(f"[{i}]{mark}{el}: {self.values[el]}")
        return "\n".join(lines) + "\n"

    def _outcome(self) -> dict[str, Any]:
        assert self._task is not None
        goal = self._task["goal"]
        fields_ok = all(self.values[k] == v for k, v in goal.items())
        others_ok = all(self.values[k] == "" for k in FIELDS if k not in goal)
        return {
            "parsed": " ".join(f"{k}={v}" for k, v in self.values.items() if v),
            "well_formed": self.submitted,
            "correct": self.submitted and fields_ok and others_ok,
            "errors": self.errors,
        }

    def _error(self, msg: str) -> StepResult:
        self.errors += 1
        return StepResult(f"error: {msg}\n" + self.render(), False, self._outcome())

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        m = _ACTION.match(action)
        if not m:
            return self._error("expected click(N), type(TEXT) or scroll(up|down)")
        verb, arg = m.group(1), m.group(2).strip()
        if verb == "scroll":
            if arg not in ("up", "down"):
                return self._error("scroll takes up or down")
            last_top = len(FIELDS) + 1 - VIEW
            self.top = max(0, min(last_top, self.top + (1 if arg == "down" else -1)))
        elif verb == "click":
            els = self._elements()
            if not re.fullmatch(r"[0-9]{1,3}", arg) or not 1 <= int(arg) <= len(els):
                return self._error(f"no element {arg[:8]} on screen")
            el = els[int(arg) - 1]
            if el == "submit":
                self.submitted = True
                return StepResult(None, True, self._outcome())
            self.focus = el
        else:
            if self.focus is None or self.focus not in self._elements():
                return self._error("nothing focused on screen")
            if len(arg) > 12 or not re.fullmatch(r"[a-z]*", arg):
                return self._error("type takes up to 12 lowercase letters")
            self.values[self.focus] = arg
        return StepResult(self.render(), False, self._outcome())

    # -- warm-up and tokenizer ----------------------------------------------------------------------
    def demonstration(self, task: dict[str, Any], flawed: bool) -> list[tuple[str, bool]]:
        """A worked episode as (text, is_model_turn) segments, produced by driving a fresh copy of the env.
        The flawed teacher submits after the first field."""
        sim = ComputerEnv()
        segs: list[tuple[str, bool]] = [(sim.reset(task, 0), False)]

        def act(a: str) -> None:
            r = sim.step(a)
            segs.append((a, True))
            if r.observation is not None:
                segs.append((r.observation, False))

        goal = list(task["goal"].items())
        for j, (field, value) in enumerate(goal):
            while field not in sim._elements():
                act("scroll(down)")
            act(f"click({sim._elements().index(field) + 1})")
            act(f"type({value})")
            if flawed and j == 0:
                break
        while "submit" not in sim._elements():
            act("scroll(down)")
        act(f"click({sim._elements().index('submit') + 1})")
        return segs

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        texts = [
            "error: expected click(N), type(TEXT) or scroll(up|down)\n",
            "scroll(up)",
            "[1] button submit\n",
        ]
        for t in tasks[:2000]:
            texts += [s for s, _ in self.demonstration(t, False)]
        return texts
