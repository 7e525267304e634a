"""The ``eval`` section: how the evaluate stage measures a policy, and the named held-out sets (suites) it
reports on (``rl_core.schema.config.Config`` holds it; kept apart so that ``config.py`` stays readable).

    cfg = load_config("configs/smoke.yaml", ["eval.suites={adds: {filter: {op: [add]}}}"])
    cfg.eval.suites["adds"].filter   # {'op': ['add']}
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EvalSuite(_Section):
    """A named held-out set: the held-out problems whose fields have the given values (a category, a
    difficulty, an operation), at most ``size`` of them, in order."""

    filter: dict[str, list[str]] = Field(
        {}, description="Task field -> the values a problem must have, e.g. {op: [add]}. Empty: all of them."
    )
    size: int | None = Field(None, ge=1, description="At most this many matching problems (None: all).")


# The inspect-ai tasks rlfoundry ships (infra/inspect/): the only ones a served deployment's form may name.
BUILTIN_INSPECT_TASKS = ("qa",)


class InspectTask(_Section):
    """A task of the inspect-ai evaluation harness, run by the evaluation sweep (and ``rlfoundry eval``)
    against each checkpoint, served by a vLLM server of rlfoundry's, from the harness's own environment
    (infra/inspect_harness.py). Its scores are stored with its log, under the checkpoint's lineage."""

    task: str = Field(
        "qa",
        description="'qa' (infra/inspect/qa_task.py: a local question/answer dataset, inspect-ai's match "
        "scorer) or FILE.py[@TASK], a task file of your own (relative to the working directory).",
    )
    dataset: str = Field(
        "heldout",
        description="'heldout': the run's held-out problems as input/target lines; or a local JSONL/CSV "
        "file, passed to the task as -T dataset=PATH.",
    )
    args: dict[str, str] = Field(
        {}, description="More task arguments (-T NAME=VALUE), e.g. {scorer: includes}."
    )
    limit: int | None = Field(None, ge=1, description="At most this many samples (None: the whole dataset).")
    max_tokens: int | None = Field(None, ge=1, description="Tokens per answer (None: rollout.max_tokens).")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature (0: greedy).")
    api: Literal["auto", "chat", "completions"] = Field(
        "auto",
        description="The server route inspect-ai calls: chat (the model's chat template) or completions (the "
        "raw prompt); auto: chat when the checkpoint's tokenizer has a chat template.",
    )
    every: int = Field(
        1, ge=1, description="The sweep runs it on every this many checkpoints (and always the run's last)."
    )
    timeout_s: float = Field(900.0, gt=0, description="The harness process's time limit.")


def _check_names(kind: str, names: list[str]) -> None:
    bad = [n for n in names if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", n)]
    if bad:
        raise ValueError(f"{kind} names must be 1-40 of a-z, 0-9, _ and - (a letter or digit first): {bad}")


class EvalSection(_Section):
    pass_k: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 8], min_length=1, description="k values for pass@k (sampled at eval temperature), each >= 1."
    )
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

    inspect: dict[str, InspectTask] = Field(
        {},
        description="Named inspect-ai tasks the evaluation sweep and `rlfoundry eval` run against each "
        "checkpoint (not the run's own evaluate stage), reported as inspect.NAME.<scorer>.<metric>; left out "
        "of the stages' hash, so a run may gain them later.",
    )

    @field_validator("suites")
    @classmethod
    def _suite_names(cls, v: dict[str, EvalSuite]) -> dict[str, EvalSuite]:
        _check_names("suite", list(v))
        return v

    @field_validator("inspect")
    @classmethod
    def _inspect_names(cls, v: dict[str, InspectTask]) -> dict[str, InspectTask]:
        _check_names("inspect task", list(v))
        return v
