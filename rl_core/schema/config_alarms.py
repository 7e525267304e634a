"""The ``alarms`` section: the rules the vitals stage (``rl_core.evaluation.vitals``) checks after every
iteration, each with what to do when it fires: ``warn`` (recorded, logged, shown) or ``stop`` (also end the
run once the iteration is committed; ``rlfoundry resume`` continues it like any stopped run).

    cfg = load_config("configs/smoke.yaml", ["alarms.kl_spike.action=stop", "alarms.kl_spike.factor=3"])

Alarms watch a run; they do not change what a stage computes: the section is left out of the hash the run's
stages are committed under (``rl_core.run.context.MONITORING``), so ``resume --set alarms.…`` needs no
``--force``, and a committed iteration keeps the alarms it recorded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Action = Literal["off", "warn", "stop"]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    action: Action = Field(
        "warn", description="off: not checked; warn: recorded and logged; stop: end the run."
    )


class NonFiniteRule(_Rule):
    action: Action = Field(
        "stop", description="NaN or inf in the loss, gradient norm, KL, entropy or reward."
    )


class KLSpikeRule(_Rule):
    factor: float = Field(
        5.0, gt=1, description="Fires when KL exceeds this times the median of earlier ones."
    )
    min_kl: float = Field(0.01, ge=0, description="...and exceeds this (no alarm on a KL near zero).")


class EntropyCollapseRule(_Rule):
    fraction: float = Field(
        0.25, gt=0, lt=1, description="Fires when entropy falls below this fraction of iteration 1's."
    )


class RewardCollapseRule(_Rule):
    fraction: float = Field(
        0.5, gt=0, lt=1, description="Fires when the mean reward falls below this fraction of the run's best."
    )
    min_best: float = Field(0.1, ge=0, description="...once the best mean reward is at least this.")


class RewardJumpRule(_Rule):
    sigmas: float = Field(
        4.0, gt=0, description="Fires when the mean reward rises more than this many std of earlier ones."
    )
    min_delta: float = Field(
        0.2, ge=0, description="...and by at least this much (the policy found a shortcut?)."
    )
    history: int = Field(3, ge=2, description="Earlier iterations needed before the rule is checked.")


class MismatchRule(_Rule):
    max: float = Field(
        1.0, gt=0, description="Fires when the largest trainer/engine logprob gap of a token exceeds this."
    )


class ThroughputRule(_Rule):
    fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Fires when generation tokens/s fall below this fraction of the baseline.",
    )
    baseline: int = Field(
        3, ge=1, description="The baseline: the median of the run's first this many iterations."
    )


class AuditRule(_Rule):
    pass


class PromptsRule(_Rule):
    action: Action = Field("warn", description="Fires when fewer prompts were sampled in total than planned.")


class AlarmsSection(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    non_finite: NonFiniteRule = Field(default_factory=NonFiniteRule, description="NaN/inf in the vitals.")
    kl_spike: KLSpikeRule = Field(default_factory=KLSpikeRule, description="A KL spike.")
    entropy_collapse: EntropyCollapseRule = Field(
        default_factory=EntropyCollapseRule, description="The policy's entropy collapsing."
    )
    reward_collapse: RewardCollapseRule = Field(
        default_factory=RewardCollapseRule, description="The mean reward collapsing from its best."
    )
    reward_jump: RewardJumpRule = Field(
        default_factory=RewardJumpRule, description="A sudden jump of the mean reward (an exploit?)."
    )
    logprob_mismatch: MismatchRule = Field(
        default_factory=MismatchRule, description="Trainer and rollout engine disagree on the sampled tokens."
    )
    throughput: ThroughputRule = Field(
        default_factory=ThroughputRule, description="Generation slower than the run's own first iterations."
    )
    audit: AuditRule = Field(
        default_factory=AuditRule, description="The reward audit raised a rate-jump alarm (reward.audit)."
    )
    prompts_skipped: PromptsRule = Field(
        default_factory=PromptsRule,
        description="Prompts sampled so far fewer than planned (a lost iteration?).",
    )
