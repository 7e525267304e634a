"""The policy-gradient fields of the ``train`` section (``rl_core.schema.config.TrainSection`` inherits them):
the algorithm, its loss options, the KL term and PPO's critic. Part of the one schema, kept apart so that
``config.py`` stays readable.

    cfg = load_config("configs/smoke.yaml", ["train.algorithm=ppo", "train.kl_coef=0.01"])

Unset options (``None``) take the algorithm's own value (its ``AlgorithmTraits``, declared here for the
built-in algorithms; ``rl_core.training.algorithms.register`` adds a user's): after validation ``clip_low``,
``clip_high`` and ``loss_agg`` always hold the value in use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator

CRITIC_FIELDS = ("gamma", "lam", "value_clip", "critic_lr")
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@dataclass(frozen=True)
class AlgorithmTraits:
    """What a config is checked and completed with, per algorithm: its loss aggregation (unless
    ``train.loss_agg`` is set; ``fixed_aggregation`` refuses another), its ratio clip (unless
    ``train.clip_low`` / ``clip_high`` are set) and whether it trains a critic (PPO's value model)."""

    aggregation: Aggregation = "token_mean"
    fixed_aggregation: bool = False
    clip: tuple[float, float] = (0.2, 0.28)
    critic: bool = False


# The built-in algorithms' traits, declared once: rl_core.training.algorithms registers their functions under
# these names (and ``register`` adds a user's algorithm here with its own traits).
ALGORITHM_TRAITS: dict[str, AlgorithmTraits] = {
    "grpo": AlgorithmTraits(),
    "drgrpo": AlgorithmTraits(aggregation="seq_mean_token_sum_norm"),
    "rloo": AlgorithmTraits(),
    "dapo": AlgorithmTraits(),
    # GSPO's clip range is the paper's: a sequence-level ratio moves far less than a token's.
    "gspo": AlgorithmTraits(aggregation="seq_mean_token_mean", fixed_aggregation=True, clip=(3e-4, 4e-4)),
    # No lower bound on CISPO's weight (MiniMax-M1 sets eps_low large); its upper bound is DAPO's.
    "cispo": AlgorithmTraits(clip=(1.0, 0.28)),
    "ppo": AlgorithmTraits(critic=True),
}


class PolicyGradientFields(BaseModel):
    algorithm: str = Field(
        "grpo",
        description="The policy-gradient algorithm (rl_core/training/algorithms.py): grpo, drgrpo, rloo, "
        "dapo "
        "(dynamic sampling and overlong penalty), gspo (sequence-level ratio), cispo (clipped IS weight x "
        "REINFORCE), ppo (value model and GAE).",
    )
    clip_low: float | None = Field(
        None, ge=0.0, le=1.0, description="Lower ratio clip epsilon; unset = the algorithm's (0.2)."
    )
    clip_high: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="Upper ratio clip epsilon; unset = the algorithm's (0.28, clip-higher; gspo 4e-4).",
    )
    loss_agg: Aggregation | None = Field(
        None,
        description="How per-token losses are aggregated (token_mean = DAPO token-level); unset = the "
        "algorithm's (token_mean; drgrpo seq_mean_token_sum_norm; gspo per sequence).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of the KL penalty to the reference (warmed-up) policy; 0 disables it.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL estimator (Schulman): k1 log-ratio, k2 half squared, k3 unbiased >= 0. As "
        "a loss, k2's gradient is KL(pi||ref)'s and k3's KL(ref||pi)'s; k1's is 0 in expectation (refused).",
    )
    kl_in: Literal["loss", "reward"] = Field(
        "loss",
        description="Where the KL penalty goes: a loss term, or subtracted from the reward before the "
        "advantages (per completion: its summed per-token KL; ppo: per token).",
    )
    overlong_cache: int | None = Field(
        None,
        ge=0,
        description="DAPO's soft overlong penalty: the last this-many tokens before rollout.max_tokens cost "
        "up to overlong_penalty; unset = the algorithm's (dapo: max_tokens // 4, others off); 0 = off.",
    )
    overlong_penalty: float = Field(
        1.0, ge=0.0, le=100.0, description="The overlong penalty at rollout.max_tokens tokens."
    )
    gamma: float = Field(1.0, gt=0.0, le=1.0, description="ppo: discount per completion token.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="ppo: GAE lambda.")
    value_clip: float = Field(
        0.2, ge=0.0, description="ppo: clip of the value update around the old value; 0 = unclipped."
    )
    critic_lr: float = Field(1e-3, gt=0.0, le=1.0, description="ppo: the critic's learning rate (AdamW).")

    @model_validator(mode="after")
    def _algorithm_fits(self) -> PolicyGradientFields:
        algo = ALGORITHM_TRAITS.get(self.algorithm)
        if algo is None:
            raise ValueError(
                f"train.algorithm: {self.algorithm!r} is not one of {', '.join(sorted(ALGORITHM_TRAITS))}"
            )
        if not algo.critic:
            for name in CRITIC_FIELDS:
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"train.{name} is used by train.algorithm=ppo only")
        elif getattr(self, "checkpoint_every", 1) != 1:
            raise ValueError(
                "train.checkpoint_every must be 1 with train.algorithm=ppo (the critic is stored)"
            )
        if algo.fixed_aggregation and self.loss_agg not in (None, algo.aggregation):
            raise ValueError(f"train.loss_agg: {self.algorithm} aggregates {algo.aggregation} only")
        if self.kl_in == "reward" and self.kl_coef == 0:
            raise ValueError("train.kl_in=reward needs train.kl_coef > 0")
        if self.kl_in == "loss" and self.kl_coef > 0 and self.kl_estimator == "k1":
            raise ValueError(
                "train.kl_estimator=k1 as a loss regularises nothing: its expected gradient is 0 (E[grad log "
                "pi] = 0 under pi); use k2 (the gradient of KL(pi||ref)) or k3, or train.kl_in=reward"
            )
        # Fill the algorithm's values in (each assignment re-validates once; the values are then set).
        if self.clip_low is None:
            self.clip_low = algo.clip[0]
        if self.clip_high is None:
            self.clip_high = algo.clip[1]
        if self.loss_agg is None:
            self.loss_agg = algo.aggregation
        return self
