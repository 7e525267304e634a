"""Stage body of score_rewards: each completion's reward from its environment outcome, then group advantages.

reward = correct_weight * correct + format_weight * well formed (a bare answer that ended with EOS)
         + partial_weight * digit_match; advantages per prompt group (GRPO: scaled by the group's std;
Dr.GRPO: not). The reward table keeps every component, so a run's rewards can be audited row by row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rl_core.context import RunContext
from rl_core.losses import group_advantages
from rl_core.stage import StageJob, StageResult


def score_rewards_body(ctx: RunContext, job: StageJob) -> StageResult:
    rc = ctx.cfg.reward
    rollouts, env_results = job.inputs["rollouts"], job.inputs["env_results"]
    df = ctx.store.read_table(rollouts)
    env = ctx.store.read_table(env_results)
    if len(df) != len(env) or not (df["prompt_index"].to_numpy() == env["prompt_index"].to_numpy()).all():
        raise ValueError(f"env results {env_results.uri} do not line up with rollouts {rollouts.uri}")
    correct = env["correct"].to_numpy(dtype=np.float64)
    # A completion is well formed when it is a bare integer that ended with EOS (not cut off by max_tokens).
    formatted = (env["well_formed"].to_numpy() & (df["finish_reason"] == "stop").to_numpy()).astype(
        np.float64
    )
    partial = env["digit_match"].to_numpy(dtype=np.float64) if "digit_match" in env else np.zeros(len(env))
    reward = rc.correct_weight * correct + rc.format_weight * formatted + rc.partial_weight * partial
    adv = group_advantages(reward, df["prompt_index"].to_numpy(), scale_by_std=rc.advantage == "grpo")
    out = pd.DataFrame(
        {
            "prompt_index": df["prompt_index"],
            "sample_index": df["sample_index"],
            "correct": correct,
            "format": formatted,
            "reward": reward,
            "advantage": adv,
        }
    )
    ref = ctx.store.write_table(f"{job.out_uri}/rewards.parquet", out)
    groups = out.groupby("prompt_index")["reward"]
    return StageResult(
        outputs={"rewards": ref},
        metrics={
            "mean_reward": float(reward.mean()),
            "accuracy": float(correct.mean()),
            "format_rate": float(formatted.mean()),
            "zero_std_groups": float((groups.std(ddof=0) == 0).mean()),
        },
    )
