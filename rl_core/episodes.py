"""Stage bodies for generate, execute_envs and score_rewards.

generate: choose this iteration's prompts (derived seed), ask the held rollout engine for ``n`` completions
per prompt (a derived seed per request) and store token ids and sampling logprobs as produced.
execute_envs: replay each completion into its environment and store the outcome.
score_rewards: correctness + format reward, then group advantages (GRPO or Dr.GRPO).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd

from rl_core.context import RunContext
from rl_core.losses import group_advantages
from rl_core.model import load_tokenizer
from rl_core.rollout import Request, SamplingSpec, get_engine, sync_weights
from rl_core.seeding import derive_seed
from rl_core.stage import StageResult, entry, ref_of

ROLLOUT_COLUMNS = [
    "prompt_index", "sample_index", "task_id", "prompt", "answer", "seed",
    "prompt_ids", "completion_ids", "logprobs", "loss_mask", "completion_text", "finish_reason",
]  # fmt: skip


def policy_engine(ctx: RunContext, ckpt: dict[str, Any]) -> Any:
    """The held rollout engine, synced to the checkpoint entry ``ckpt``."""
    local = ctx.local_checkpoint(ckpt)
    engine = get_engine(ctx.cfg.rollout.engine, local, ctx.cfg.rollout, max_model_len=ctx.max_model_len())
    sync_weights(engine, local, ckpt["files"]["model.safetensors"])
    return engine


def sample_table(
    ctx: RunContext, ckpt: dict[str, Any], tasks: list[dict[str, Any]], spec: SamplingSpec, seeds: list[int]
) -> pd.DataFrame:
    """``spec.n`` completions for each task, one row per completion, token ids as the engine produced them."""
    tok = load_tokenizer(ctx.local_checkpoint(ckpt))
    envs = [ctx.env for _ in tasks]
    prompts = [env.reset(t, s) for env, t, s in zip(envs, tasks, seeds, strict=True)]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    engine = policy_engine(ctx, ckpt)
    outs = engine.generate([Request(ids, s) for ids, s in zip(prompt_ids, seeds, strict=True)], spec)
    rows = []
    for i, (task, ids, comps) in enumerate(zip(tasks, prompt_ids, outs, strict=True)):
        for k, c in enumerate(comps):
            rows.append(
                {
                    "prompt_index": i,
                    "sample_index": k,
                    "task_id": task["task_id"],
                    "prompt": prompts[i],
                    "answer": task["answer"],
                    "seed": seeds[i],
                    "prompt_ids": ids,
                    "completion_ids": c.token_ids,
                    "logprobs": c.logprobs,
                    "loss_mask": [1] * len(c.token_ids),
                    "completion_text": c.text,
                    "finish_reason": c.finish_reason,
                }  # fmt: skip
            )
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS)


def generate_body(ctx: RunContext, iteration: int, policy: dict[str, Any], uri: str) -> StageResult:
    cfg = ctx.cfg
    pick_seed = derive_seed(cfg.experiment.seed, iteration, "generate", "prompts")
    chosen = random.Random(pick_seed).sample(range(len(ctx.train_tasks)), cfg.rollout.prompts_per_iteration)
    tasks = [ctx.train_tasks[i] for i in chosen]
    seeds = [derive_seed(cfg.experiment.seed, iteration, "generate", i) for i in range(len(tasks))]
    r = cfg.rollout
    spec = SamplingSpec(n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)
    df = sample_table(ctx, policy, tasks, spec, seeds)
    ref = ctx.store.write_table(f"{uri}/rollouts.parquet", df)
    lengths = df["completion_ids"].map(len)
    return StageResult(
        outputs={"rollouts": entry(ref, rows=len(df))},
        metrics={
            "completions": len(df),
            "tokens": int(lengths.sum()),
            "mean_completion_tokens": float(lengths.mean()),
            "stop_fraction": float((df["finish_reason"] == "stop").mean()),
        },
        seeds={
            "prompts": pick_seed,
            "requests": "derive_seed(run_seed, iteration, 'generate', prompt_index)",
        },
    )


def env_outcomes(ctx: RunContext, df: pd.DataFrame) -> pd.DataFrame:
    tasks = {t["task_id"]: t for t in ctx.train_tasks + ctx.heldout_tasks}
    rows = []
    for r in df.itertuples(index=False):
        env = ctx.env
        env.reset(tasks[r.task_id], int(r.seed))
        res = env.step(r.completion_text)
        rows.append(
            {"prompt_index": r.prompt_index, "sample_index": r.sample_index, "done": res.done, **res.outcome}
        )
    return pd.DataFrame(rows)


def execute_envs_body(ctx: RunContext, rollouts: dict[str, Any], uri: str) -> StageResult:
    df = ctx.store.read_table(ref_of(rollouts))
    out = env_outcomes(ctx, df)
    ref = ctx.store.write_table(f"{uri}/env_results.parquet", out)
    return StageResult(
        outputs={"env_results": entry(ref, rows=len(out))},
        metrics={"well_formed": float(out["well_formed"].mean()), "correct": float(out["correct"].mean())},
    )


def score_rewards_body(
    ctx: RunContext, rollouts: dict[str, Any], env_results: dict[str, Any], uri: str
) -> StageResult:
    rc = ctx.cfg.reward
    df = ctx.store.read_table(ref_of(rollouts))
    env = ctx.store.read_table(ref_of(env_results))
    if len(df) != len(env) or not (df["prompt_index"].to_numpy() == env["prompt_index"].to_numpy()).all():
        raise ValueError(f"env results {env_results['uri']} do not line up with rollouts {rollouts['uri']}")
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
        }  # fmt: skip
    )
    ref = ctx.store.write_table(f"{uri}/rewards.parquet", out)
    groups = out.groupby("prompt_index")["reward"]
    return StageResult(
        outputs={"rewards": entry(ref, rows=len(out))},
        metrics={
            "mean_reward": float(reward.mean()),
            "accuracy": float(correct.mean()),
            "format_rate": float(formatted.mean()),
            "zero_std_groups": float((groups.std(ddof=0) == 0).mean()),
        },
    )
