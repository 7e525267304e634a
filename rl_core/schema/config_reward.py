"""Rewards as infrastructure: the ``reward`` section's served reward model, LLM judge and audit settings
(``rl_core.schema.config.RewardSection`` holds them; part of the one schema, kept apart so that ``config.py``
stays readable).

    cfg = load_config("configs/smoke.yaml", ["reward.audit.zero=[exploit]"])
    cfg.reward.audit.zero   # ['exploit']: every completion flagged with an exploit scores 0

The reward model and the judge are reward components like any other: a key of ``reward.weights``
(``reward_model``, ``judge``) turns one on; these sections say how it is reached.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The built-in reward components, declared here once: rl_core.scoring.rewards registers a function under each
# of these names and refuses any other. Every other ``reward.weights`` key is the user's: ``module:function``
# or an entry point of ``REWARD_ENTRY_POINTS``.
BUILTIN_REWARDS = ("correct", "format", "partial", "reward_model", "judge")
REWARD_ENTRY_POINTS = "rlfoundry.rewards"

# The audit's flags, by category (rl_core.scoring.audit raises them; ``reward.audit.zero`` names them):
# attacks on the grader's code (rl_core.scoring.audit_code), on the grader's verdict, on the judge; and
# heuristics.
CODE_FLAGS = (
    "exit_call",
    "tamper_builtins",
    "tamper_harness",
    "always_equal",
    "reads_files",
    "fake_output",
    "stall",
    "spawns_process",
    "dynamic_code",
)
GRADER_FLAGS = ("exited_before_tests", "non_plain_return")
EXPLOIT = (*CODE_FLAGS, *GRADER_FLAGS, "judge_injection")
HEURISTIC = ("empty_answer", "prompt_independent", "length_outlier", "repetition", "judge_address")
CATEGORIES = {"exploit": EXPLOIT, "heuristic": HEURISTIC, "all": EXPLOIT + HEURISTIC}


def zeroed_flags(names: list[str]) -> set[str]:
    """The flags ``reward.audit.zero`` names (flags and categories); an unknown name is an error.

    >>> sorted(zeroed_flags(["heuristic"]))
    ['empty_answer', 'judge_address', 'length_outlier', 'prompt_independent', 'repetition']
    """
    out: set[str] = set()
    for n in names:
        if n in CATEGORIES:
            out |= set(CATEGORIES[n])
        elif n in CATEGORIES["all"]:
            out.add(n)
        else:
            known = ", ".join([*CATEGORIES, *CATEGORIES["all"]])
            raise ValueError(f"reward.audit.zero: unknown flag or category {n!r} (known: {known})")
    return out


def check_reward_names(names: Iterable[str]) -> None:
    """Every ``reward.weights`` key is a built-in component or a user's function that imports and has the
    signature (the user's module is imported to check it; nothing of the library is)."""
    for name in names:
        if name not in BUILTIN_REWARDS:
            user_reward_function(name)


def user_reward_function(name: str) -> Callable[..., Any]:
    """The user's reward function a ``reward.weights`` key names (``module:function`` or an entry point),
    imported and checked to be a function of (prompt, completion, outcome); an error names what is wrong."""
    from envs.base import resolve  # the one resolver of user objects (environments and reward functions)

    fn, target = resolve(name, dict.fromkeys(BUILTIN_REWARDS), REWARD_ENTRY_POINTS, "reward function")
    try:
        inspect.signature(fn).bind("prompt", "completion", None)
    except (TypeError, ValueError):
        raise ValueError(
            f"reward.weights: {name!r} ({target}) is not a function of (prompt, completion, outcome)"
        ) from None
    return fn


class _Sub(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RewardModelSettings(_Sub):
    """The served reward model (``reward.weights: {reward_model: w}``)."""

    path: str = Field(
        "",
        description="The reward model: a Hugging Face folder with a scalar head (e.g. one `rlfoundry "
        "reward-model train` wrote). The flow starts a server on it when url is empty.",
    )
    url: str = Field(
        "", description="A running reward server (`rlfoundry up --reward-server`); empty: start one."
    )
    batch_size: int = Field(64, ge=1, le=4096, description="Completions per request to the reward server.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds one batch request may take.")
    retries: int = Field(3, ge=0, le=20, description="Retries of a failed batch before the stage fails.")
    train_steps: int = Field(
        600, ge=1, le=100_000, description="`rlfoundry reward-model train`: optimizer steps (pairwise loss)."
    )
    train_tasks: int = Field(
        4000,
        ge=10,
        le=1_000_000,
        description="`rlfoundry reward-model train`: training problems the preference pairs come from (at "
        "least task.train_size; the held-out problems stay out).",
    )
    train_batch: int = Field(
        64, ge=1, le=4096, description="`rlfoundry reward-model train`: preference pairs per step."
    )
    lr: float = Field(1e-3, gt=0, le=1.0, description="`rlfoundry reward-model train`: AdamW learning rate.")
    kv_cache_mb: int = Field(64, ge=16, le=65536, description="KV cache of the reward server (vLLM), MiB.")


DEFAULT_TEMPLATE = "Question: {prompt}\nAnswer: <answer>{completion}</answer>\nScore (0-{max_score}):"
DEFAULT_PAIRWISE = (
    "Question: {prompt}\nAnswer 1: <answer>{first}</answer>\nAnswer 2: <answer>{second}</answer>\n"
    "Better (1 or 2):"
)


def check_template(template: str, required: tuple[str, ...], tagged: tuple[str, ...]) -> str:
    """``template`` holds each ``required`` placeholder exactly once, no other placeholder than those and
    ``{max_score}``, and each ``tagged`` one between a tag that ends with '>' and one that starts with '<'
    (the renderer escapes & < > inside it, so an answer cannot close its tag).

    >>> check_template("Q: {prompt} A: <a>{completion}</a>", ("prompt", "completion"), ("completion",))
    'Q: {prompt} A: <a>{completion}</a>'
    >>> check_template("Q: {prompt} A: {completion}", ("prompt", "completion"), ("completion",))
    Traceback (most recent call last):
    ...
    ValueError: {completion} must sit between tags, e.g. <answer>{completion}</answer>
    """
    import string

    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    for name in required:
        if names.count(name) != 1:
            raise ValueError(f"must hold {{{name}}} exactly once (holds it {names.count(name)} times)")
    unknown = sorted(set(names) - set(required) - {"max_score"})
    if unknown:
        raise ValueError(f"unknown placeholder(s) {unknown}: use {sorted(required)} and max_score")
    for name in tagged:
        before, after = template.split(f"{{{name}}}")
        if not (before.endswith(">") and after.startswith("<")):
            raise ValueError(f"{{{name}}} must sit between tags, e.g. <answer>{{{name}}}</answer>")
    return template


class JudgeSettings(_Sub):
    """The LLM judge (``reward.weights: {judge: w}``): a causal LM run on a rollout engine, its score parsed
    from what it writes (``rl_core.scoring.judge``)."""

    model: str = Field(
        "",
        description="The judge: a Hugging Face causal LM folder (e.g. one `rlfoundry judge train` wrote), a "
        "local path or an fsspec URL.",
    )
    engine: Literal["vllm", "hf"] = Field(
        "vllm", description="The rollout engine the judge runs on (as rollout.engine: vLLM, or HF)."
    )
    template: str = Field(
        DEFAULT_TEMPLATE,
        description="The judge prompt: {prompt} and {completion} once each ({completion} between tags; & < > "
        "inside it are escaped, so the answer cannot close its tag), optionally {max_score}.",
    )
    pairwise_template: str = Field(
        DEFAULT_PAIRWISE,
        description="The pairwise prompt of the consistency check: {prompt}, {first} and {second} once "
        "each ({first} and {second} between tags), optionally {max_score}; the judge answers 1 or 2.",
    )
    max_score: int = Field(
        9,
        ge=1,
        le=100,
        description="The rubric's top score: a verdict k in [0, max_score] rewards k/max_score.",
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Judge sampling temperature (0: greedy).")
    max_tokens: int = Field(8, ge=1, le=512, description="Most tokens of one verdict.")
    consistency_samples: int = Field(
        8,
        ge=0,
        le=4096,
        description="Per iteration, answers judged a second time (judge_self_agreement) and pairs of answers "
        "to one prompt judged in both orders (judge_pairwise_agreement); 0 turns the checks off.",
    )

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_template(v, ("prompt", "completion"), ("completion",))

    @field_validator("pairwise_template")
    @classmethod
    def _pairwise(cls, v: str) -> str:
        return check_template(v, ("prompt", "first", "second"), ("first", "second"))


class AuditSettings(_Sub):
    """The audit stage: flags per rollout, zeroing by config, an alarm when a flag's rate jumps."""

    enabled: bool = Field(
        True, description="Run the audit stage (flags stored per rollout, rates per iteration)."
    )
    zero: list[str] = Field(
        default_factory=lambda: ["exploit"],
        description="Flags whose completions score 0 (before advantages): flag names, or a category: "
        "'exploit' (attacks on the grader, the harness or the judge), 'heuristic' (format-only, length and "
        "repetition outliers), 'all'. Empty: flag only.",
    )

    @field_validator("zero")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        zeroed_flags(v)
        return v

    alarm_jump: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Alarm when a flag's rate this iteration exceeds its running baseline by this much "
        "(absolute; the baseline is the mean rate of the earlier iterations).",
    )
