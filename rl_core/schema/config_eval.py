"""The ``eval`` section: how the evaluate stage measures a policy, and the named held-out sets (suites) it
reports on (``rl_core.schema.config.Config`` holds it; kept apart so that ``config.py`` stays readable).

    cfg = load_config("configs/smoke.yaml", ["eval.suites={adds: {filter: {op: [add]}}}"])
    cfg.eval.suites["adds"].filter   # {'op': ['add']}
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EvalSuite(_Section):
    """A named held-out set: the held-out problems whose fields have the given values (a category, a
    difficulty, an operation), at most ``size`` of them, in order."""

    filter: dict[str, list[str]] = Field(
        {}, description="Task field -> the values a problem must have, e.g. {op: [add]}. Empty: all of them."
    )
    size: int | None = Field(None, ge=1, description="At most this many matching problems (None: all).")


class EvalSection(_Section):
    pass_k: list[int] = Field([1, 8], description="k values for pass@k (sampled at eval temperature).")
    samples: int = Field(8, ge=1, description="Samples per held-out problem for pass@k (>= max k).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature for pass@k.")
    mean_reward: bool = Field(
        True,
        description="Also score the sampled held-out completions with reward.weights (a judge or reward "
        "server included) and report mean_reward and suite.NAME.mean_reward.",
    )
    every: int = Field(5, ge=1, description="Evaluate every this many iterations (and always the last).")
    suites: dict[str, EvalSuite] = Field(
        {},
        description="Named held-out sets (by category or difficulty), each reported as suite.NAME.accuracy, "
        "suite.NAME.pass@k, suite.NAME.mean_reward and suite.NAME.problems by the evaluate stage, the sweep "
        "and `rlfoundry eval`.",
    )

    @field_validator("suites")
    @classmethod
    def _suite_names(cls, v: dict[str, EvalSuite]) -> dict[str, EvalSuite]:
        bad = [n for n in v if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", n)]
        if bad:
            raise ValueError(
                f"suite names must be 1-40 of a-z, 0-9, _ and - (a letter or digit first): {bad}"
            )
        return v
