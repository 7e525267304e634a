"""Rewards as infrastructure: the ``reward`` section's served reward model, LLM judge and audit settings
(``rl_core.config.RewardSection`` holds them; part of the one schema, kept apart so that ``config.py`` stays
readable).

    cfg = load_config("configs/smoke.yaml", ["reward.audit.zero=[exploit]"])
    cfg.reward.audit.zero   # ['exploit']: every completion flagged with an exploit scores 0

The reward model and the judge are reward components like any other: a key of ``reward.weights``
(``reward_model``, ``judge``) turns one on; these sections say how it is reached.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Sub(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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


class JudgeSettings(_Sub):
    """The LLM judge (``reward.weights: {judge: w}``)."""

    model: str = Field(
        "",
        description="The judge: a Hugging Face causal LM folder (e.g. one `rlfoundry judge train` wrote).",
    )


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
    alarm_jump: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Alarm when a flag's rate this iteration exceeds its running baseline by this much "
        "(absolute; the baseline is the mean rate of the earlier iterations).",
    )
