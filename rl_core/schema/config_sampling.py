"""What the rollout samples with: the ``rollout`` section's sampling fields
(``rl_core.schema.config.RolloutSection`` inherits them; part of the one schema, kept apart so that
``config.py`` stays readable).

The PPO ratio compares the trainer's logprobs of a completion with the sampler's, so sampling is only what the
trainer can match: a temperature above 0 (greedy decoding is for evaluation, ``eval.temperature``) and the
whole distribution (``top_p`` 1.0: a nucleus sampler's logprobs are renormalised over a truncated
distribution the trainer does not compute). Either is refused at config load with the reason.

    load_config(None, ["rollout.top_p=0.9"])   # ConfigError: rollout.top_p: must be 1.0: ...
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class SamplingFields(BaseModel):
    temperature: float = Field(
        1.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature (> 0: the trainer's logprobs are the sampler's at this "
        "temperature; greedy decoding is for evaluation, eval.temperature).",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling threshold: only 1.0. The trainer's logprobs are of the whole "
        "distribution, so a truncated sampler would make the PPO ratio compare two distributions.",
    )

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, v: float) -> float:
        if v == 0:
            raise ValueError(
                "0 is greedy decoding, which has no sampling distribution to train on (the trainer's "
                "logprobs at temperature 0 are undefined: a NaN loss); greedy decoding is for evaluation "
                "(eval.temperature)"
            )
        return v

    @field_validator("top_p")
    @classmethod
    def _whole_distribution(cls, v: float) -> float:
        if v < 1:
            raise ValueError(
                "must be 1.0: the sampler would draw from the nucleus, renormalised, while the trainer's "
                "logprobs are of the whole distribution, so the PPO ratio would compare two different "
                "distributions; sharpen sampling with rollout.temperature instead"
            )
        return v
