"""Multimodal counting: a procedurally drawn picture of shapes and a question about it.

A scene is a 4x4 grid of 8x8-pixel cells (a 32x32 RGB image); 1-6 cells hold a filled square or circle in red,
green or blue. The question asks how many shapes of one colour, of one kind, or in all: ``count red`` ->
``2``. The answer is only in the picture (the text names just the question), so a model must look to score.
The image is rendered from the task's scene (``render``), so the same task gives the same pixels on any
machine; rollouts also store it as PNG. Single-turn; the verifier takes a bare integer.

    env = ShapesEnv()
    prompt = env.reset(task, seed=0)   # "count red\\n"
    png = env.image(task)              # PNG bytes, 32x32
    env.step("2").outcome["correct"]

``shape_rounds`` (``ShapeRoundsEnv``) shows a new picture in every turn: round 1 asks about the task's first
picture; each answer is met by the next picture (``StepResult.images``) and its question, and the episode is
correct when every round is: an environment whose observations are images.
"""

from __future__ import annotations

import io
import json
import random
from typing import Any

from pydantic import BaseModel, Field

from envs.arithmetic import ArithmeticEnv
from envs.base import NoOptions, StepResult, draw_tasks

COLORS = {"red": (220, 30, 30), "green": (30, 160, 30), "blue": (30, 30, 220)}
KINDS = ("square", "circle")
QUESTIONS = (*COLORS, *KINDS, "all")
GRID, CELL = 4, 8
IMAGE_SIZE = GRID * CELL
MAX_SHAPES = 6


def count(scene: list[list[Any]], question: str) -> int:
    """How many shapes of the scene match ``question`` (a colour, a kind, or "all")."""
    if question not in QUESTIONS:
        raise ValueError(f"unknown question {question!r}; one of {', '.join(QUESTIONS)}")
    return sum(1 for _cell, color, kind in scene if question in ("all", color, kind))


def render(scene: list[list[Any]]) -> Any:
    """The scene as a 32x32 RGB PIL image on white."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for cell, color, kind in scene:
        x, y = (cell % GRID) * CELL, (cell // GRID) * CELL
        box = [x + 1, y + 1, x + CELL - 2, y + CELL - 2]
        if kind == "square":
            draw.rectangle(box, fill=COLORS[color])
        else:
            draw.ellipse(box, fill=COLORS[color])
    return img


def png(scene: list[list[Any]]) -> bytes:
    buf = io.BytesIO()
    render(scene).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


class ShapesEnv(ArithmeticEnv):
    """Episodes and the verifier (a bare integer) are arithmetic's; the tasks and their pictures are new."""

    name = "shapes"
    config_model: type[BaseModel] = NoOptions
    image_size = IMAGE_SIZE

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        def draw(rng: random.Random) -> dict[str, Any]:
            n = rng.randint(1, MAX_SHAPES)
            cells = sorted(rng.sample(range(GRID * GRID), n))
            scene = [[c, rng.choice(list(COLORS)), rng.choice(KINDS)] for c in cells]
            question = rng.choice(QUESTIONS)
            return {
                "prompt": f"count {question}\n",
                "answer": str(count(scene, question)),
                "op": question,
                "scene": scene,
                # Many scenes share a prompt: the split and de-duplication key is the whole task.
                "key": json.dumps([question, scene]),
            }

        return draw_tasks("shapes", split, task_cfg, seed, draw)

    def image(self, task: dict[str, Any]) -> bytes:
        """The task's picture as PNG bytes (deterministic)."""
        return png(task["scene"])

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        return [t["prompt"] for t in tasks] + [str(i) for i in range(MAX_SHAPES + 1)]


class RoundsOptions(BaseModel):
    model_config = {"extra": "forbid"}
    rounds: int = Field(
        2, ge=2, le=6, description="Pictures (and questions) per episode, one per model turn."
    )


def _scene(rng: random.Random) -> tuple[list[list[Any]], str]:
    n = rng.randint(1, MAX_SHAPES)
    cells = sorted(rng.sample(range(GRID * GRID), n))
    return [[c, rng.choice(list(COLORS)), rng.choice(KINDS)] for c in cells], rng.choice(QUESTIONS)


class ShapeRoundsEnv(ShapesEnv):
    """Several pictures per episode, one per turn: the model answers each question about the picture just
    shown; the next picture comes with the environment's answer."""

    name = "shape_rounds"
    config_model: type[BaseModel] = RoundsOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        super().__init__(options or RoundsOptions())
        assert isinstance(self.options, RoundsOptions)
        self.max_turns = self.options.rounds
        self._round, self._answers = 0, []

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        assert isinstance(self.options, RoundsOptions)
        rounds = self.options.rounds

        def draw(rng: random.Random) -> dict[str, Any]:
            drawn = [_scene(rng) for _ in range(rounds)]
            answers = [str(count(scene, q)) for scene, q in drawn]
            return {
                "prompt": f"count {drawn[0][1]}\n",
                "answer": " ".join(answers),
                "op": drawn[0][1],
                "scene": drawn[0][0],
                "rounds": [
                    {"scene": scene, "question": q, "answer": a}
                    for (scene, q), a in zip(drawn, answers, strict=True)
                ],
                "key": json.dumps(drawn),
            }

        return draw_tasks("shape_rounds", split, task_cfg, seed, draw)

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._round, self._answers = 0, []
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        rounds = self._task["rounds"]
        self._answers.append(action.strip())
        self._round += 1
        right = [a == r["answer"] for a, r in zip(self._answers, rounds, strict=False)]
        outcome = {  # so far: an episode cut off before the last round ends on it, not solved
            "parsed": " ".join(self._answers),
            "well_formed": all(a.isdigit() for a in self._answers),
            "correct": len(right) == len(rounds) and all(right),
            "digit_match": sum(right) / len(rounds),
        }
        if self._round < len(rounds):
            nxt = rounds[self._round]
            return StepResult(f"count {nxt['question']}\n", False, outcome, images=(png(nxt["scene"]),))
        return StepResult(observation=None, done=True, outcome=outcome)
