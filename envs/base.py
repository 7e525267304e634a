"""The environment contract and registry.

An environment turns a task into an episode. Episodes may be multi-turn: ``reset(task, seed)`` gives the first
observation (the prompt), then the generate stage alternates engine calls and ``step(action)`` until ``done``.
``outcome`` is what the reward stage scores. Environments that run model-written code take an ``Executor``
(the sandbox in ``envs/sandbox``), never ``exec`` on the host.

    env = make_env("arithmetic")
    tasks = env.tasks("train", task_cfg, seed=0)
    first = env.reset(tasks[0], seed=1)
    result = env.step("46")
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StepResult:
    """What the environment answers to one action."""

    observation: str | None
    done: bool
    outcome: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecResult:
    """What an executor reports about one run of untrusted code."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    killed_reason: str | None = None


@runtime_checkable
class Executor(Protocol):
    """Runs untrusted code in isolation (implemented by ``envs.sandbox``)."""

    def run(self, code: str, *, timeout_s: float, memory_mb: int) -> ExecResult: ...


@runtime_checkable
class Env(Protocol):
    """One episode at a time; instances are cheap, one per episode."""

    name: str

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        """The task list of a split ("train" or "heldout"), deterministic in ``seed``."""
        ...

    def reset(self, task: dict[str, Any], seed: int) -> str:
        """Start an episode; returns the first observation (the prompt text)."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's action (its completion text)."""
        ...


def draw_tasks(
    name: str, split: str, task_cfg: Any, seed: int, draw: Callable[[random.Random], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Distinct tasks of one split from a seeded generator: ``draw(rng)`` makes one task (with "prompt", and a
    "key" when the prompt alone does not identify it, e.g. an image task); a task belongs to the held-out
    split by a hash of its key (``is_heldout``), so the splits are disjoint."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want = task_cfg.train_size if split == "train" else task_cfg.heldout_size
    rng = random.Random(f"{name}:{seed}:{split}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(want * 50):
        if len(out) == want:
            break
        task = draw(rng)
        key = task.get("key", task["prompt"])
        if key in seen or is_heldout(key) != (split == "heldout"):
            continue
        seen.add(key)
        out.append({"task_id": f"{split}-{len(out)}", **task})
    if len(out) < want:
        raise ValueError(f"task.{split}_size={want}: only {len(out)} distinct {name} tasks drawn")
    return out


def is_heldout(text: str) -> bool:
    """~10% of a problem space, chosen by a hash of the problem's text."""
    return hashlib.sha256(text.encode()).digest()[0] < 26


_REGISTRY: dict[str, Callable[[], Env]] = {}


def register(name: str) -> Callable[[Callable[[], Env]], Callable[[], Env]]:
    def deco(factory: Callable[[], Env]) -> Callable[[], Env]:
        _REGISTRY[name] = factory
        return factory

    return deco


def make_env(name: str) -> Env:
    from envs import arithmetic, computer, countup, humaneval, shapes, tools  # noqa: F401  (they register)

    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()


def registered() -> list[str]:
    from envs import arithmetic, computer, countup, humaneval, shapes, tools  # noqa: F401

    return sorted(_REGISTRY)
