"""The code environment: write a small Python function; hidden tests run in the sandbox decide the reward.

HumanEval-style episodes over a family of tasks that rlfoundry generates (``envs/code/tasks.py``: a signature
and a docstring with one example; the solution is a one-line body; several hidden tests), so that the tiny
built-in model can learn it; ``envs/humaneval.py`` stays the scoring path for the real benchmark. Every
completion runs in a sandbox run of its own (``envs/code/run.py`` states the threat model; the harness in
``envs/code/harness.py`` keeps the tests and the nonce away from the model's code). Single-turn.

The outcome holds ``correct`` (every hidden test passed), ``well_formed`` (it parsed, defined the function and
imported), ``tests_passed`` (the fraction of hidden tests passed), ``sandbox_s`` (seconds of sandbox run spent
on it: 0 for a completion rejected before running or sharing an identical completion's run; the stage sums
them), ``cached`` and ``flags``. ``step_many`` scores a batch through the pool at once: use it for RL batches.

    env = CodeEnv(CodeConfig(templates=["affine"]))
    task = env.tasks("train", task_cfg, seed=0)[0]   # task_cfg: .train_size, .heldout_size
    prompt = env.reset(task, seed=0)
    env.step(task["answer"]).outcome["correct"]      # True
    env.step(env.flawed(task)).outcome["correct"]    # False: the warm-up's flawed teacher
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.base import StepResult
from envs.code.run import close_pools, run_candidates
from envs.code.tasks import TEMPLATES, flawed_answer, make_tasks

__all__ = ["TEMPLATES", "CodeConfig", "CodeEnv", "close_pools"]


class CodeConfig(BaseModel):
    """The code environment's own options (the task family and the sandbox limits of one candidate)."""

    model_config = ConfigDict(extra="forbid")

    templates: list[str] = Field(
        default_factory=lambda: list(TEMPLATES),
        min_length=1,
        description=f"Function templates to draw tasks from: any of {', '.join(TEMPLATES)}.",
    )
    max_constant: int = Field(
        99, ge=2, le=999, description="Largest constant in a task's function (a template may use fewer)."
    )
    hidden_tests: int = Field(5, ge=1, le=20, description="Hidden tests per task (inputs not in the prompt).")
    test_budget_s: float = Field(
        1.0, gt=0, le=30, description="Seconds the candidate's code may take over all its hidden tests."
    )
    timeout_s: float = Field(
        5.0,
        gt=0,
        le=120,
        description="Sandbox wall-clock limit of one candidate's run (interpreter included).",
    )
    memory_mb: int = Field(256, ge=32, le=8192, description="Sandbox memory limit of one candidate's run.")
    max_procs: int = Field(8, ge=2, le=256, description="Sandbox process limit of one candidate's run.")
    workers: int = Field(0, ge=0, le=512, description="Sandbox pool workers (0: one per CPU core).")
    max_chars: int = Field(
        4000, ge=100, description="Longest prompt + completion run at all; a longer one is failed unparsed."
    )

    @model_validator(mode="after")
    def _check(self) -> CodeConfig:
        unknown = sorted(set(self.templates) - set(TEMPLATES))
        if unknown:
            raise ValueError(f"unknown templates {unknown}; known: {', '.join(TEMPLATES)}")
        if self.timeout_s <= self.test_budget_s:
            raise ValueError(f"timeout_s={self.timeout_s} must exceed test_budget_s={self.test_budget_s}")
        return self


class CodeEnv:
    """One episode: the prompt, one completion, the hidden tests' verdict."""

    name = "code"
    config_model = CodeConfig

    def __init__(self, config: CodeConfig | None = None) -> None:
        self.config = config or CodeConfig()
        self._task: dict[str, Any] | None = None

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        """Distinct tasks of a split (``task_cfg.train_size`` / ``heldout_size``); the splits share no
        function."""
        c = self.config
        return make_tasks(split, task_cfg, seed, c.templates, c.hidden_tests, c.max_constant)

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task = task
        return task["prompt"]

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        return self.step_many([(self._task, action)])[0]

    def solution_source(self, prompt: str, completion: str) -> str:
        """The module the grader imports: the prompt (signature and docstring) and the completion."""
        return prompt + completion + "\n"

    def step_many(self, episodes: Sequence[tuple[dict[str, Any], str]]) -> list[StepResult]:
        """Single-turn episodes (task, completion) scored together, in order: one pool map for the batch."""
        return [
            StepResult(observation=None, done=True, outcome=o) for o in run_candidates(episodes, self.config)
        ]

    def flawed(self, task: dict[str, Any]) -> str:
        """The flawed teacher's demonstration answer (first constant plus one: fails the hidden tests)."""
        return flawed_answer(task)

    def demonstration(self, task: dict[str, Any], flawed: bool) -> list[tuple[str, bool]]:
        """The warm-up's (text, is_model_turn) segments, as ``rl_core/training/sft.py`` reads them today."""
        return [(task["prompt"], False), (self.flawed(task) if flawed else task["answer"], True)]

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        """The tokenizer's training text: prompts, right answers and the flawed teacher's answers."""
        return [t["prompt"] for t in tasks] + [t["answer"] for t in tasks] + [self.flawed(t) for t in tasks]
