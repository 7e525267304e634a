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
from rl_core.paths import PROJECT_ROOT
from rl_core.rollout import Request, SamplingSpec, get_engine, sync_weights
from rl_core.seeding import derive_seed
from rl_core.stage import StageResult, entry, ref_of
from rl_core.vision import image_prefix

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
    """``spec.n`` episodes for each task, one row per episode, token ids as the engine produced them.

    Single-turn environments: one engine call. Multi-turn ones (``env.max_turns > 1``): the engine and the
    environment alternate; each observation's tokens are appended after the model's turn with loss_mask 0
    and logprob 0, so the stored sequence is exactly what the engine was conditioned on (never re-tokenized)."""
    if getattr(ctx.env, "max_turns", 1) > 1:
        return _multi_turn_table(ctx, ckpt, tasks, spec, seeds)
    local = ctx.local_checkpoint(ckpt)
    tok = load_tokenizer(local)
    envs = [ctx.env for _ in tasks]
    prompts = [env.reset(t, s) for env, t, s in zip(envs, tasks, seeds, strict=True)]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    images: list[tuple[bytes, ...]] = [() for _ in tasks]
    if getattr(ctx.env, "multimodal", False):
        prefix = image_prefix(local)
        prompt_ids = [prefix + ids for ids in prompt_ids]
        images = [(ctx.env.image(t),) for t in tasks]
    engine = policy_engine(ctx, ckpt)
    reqs = [Request(ids, s, im) for ids, s, im in zip(prompt_ids, seeds, images, strict=True)]
    outs = engine.generate(reqs, spec)
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
            if images[i]:
                rows[-1]["image"] = images[i][0]
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS + (["image"] if any(images) else []))


def _multi_turn_table(
    ctx: RunContext, ckpt: dict[str, Any], tasks: list[dict[str, Any]], spec: SamplingSpec, seeds: list[int]
) -> pd.DataFrame:
    from envs.base import make_env

    if getattr(ctx.env, "multimodal", False):
        raise ValueError(f"environment {ctx.env.name!r}: multi-turn episodes with images are not supported")
    tok = load_tokenizer(ctx.local_checkpoint(ckpt))
    engine = policy_engine(ctx, ckpt)
    limit = ctx.max_model_len()
    max_turns = ctx.env.max_turns
    prompts, prompt_ids = [], []
    for t, s in zip(tasks, seeds, strict=True):
        prompts.append(make_env(ctx.cfg.task.env).reset(t, s))
        prompt_ids.append(tok(prompts[-1], add_special_tokens=False)["input_ids"])
    # Turn 1: n samples per prompt from the prompt's seed (as single-turn); later turns: one request per episode.
    first = engine.generate([Request(ids, s) for ids, s in zip(prompt_ids, seeds, strict=True)], spec)
    eps: list[dict[str, Any]] = []
    for i, comps in enumerate(first):
        for k, c in enumerate(comps):
            env = make_env(ctx.cfg.task.env)
            env.reset(tasks[i], seeds[i])
            eps.append({"i": i, "k": k, "env": env, "ids": list(c.token_ids), "lp": list(c.logprobs),
                        "mask": [1] * len(c.token_ids), "last": c, "turns": 1, "done": False, "outcome": {},
                        "actions": [], "observations": []})  # fmt: skip
    for turn in range(1, max_turns + 1):
        active = []
        for e in eps:
            if e["done"]:
                continue
            action = tok.decode(e["last"].token_ids, skip_special_tokens=True)
            res = e["env"].step(action)
            e["actions"].append(action)
            e["outcome"] = res.outcome
            if res.done or turn == max_turns:
                e["done"] = True
                if not res.done:
                    e["outcome"] = {**res.outcome, "truncated": True}
                continue
            obs = tok(res.observation or "", add_special_tokens=False)["input_ids"]
            room = limit - len(prompt_ids[e["i"]]) - len(e["ids"]) - len(obs)
            if room < 2:  # no room for the observation and another turn: the episode ends here
                e["done"], e["outcome"] = True, {**res.outcome, "truncated": True}
                continue
            e["observations"].append(res.observation or "")
            e["ids"] += obs
            e["lp"] += [0.0] * len(obs)
            e["mask"] += [0] * len(obs)
            active.append((e, room))
        if not active:
            break
        reqs = [
            Request(prompt_ids[e["i"]] + e["ids"], derive_seed(seeds[e["i"]], e["k"], "turn", turn))
            for e, _ in active
        ]
        budget = min(spec.max_tokens, min(r for _, r in active) - 1)
        outs = engine.generate(
            reqs, SamplingSpec(n=1, temperature=spec.temperature, top_p=spec.top_p, max_tokens=budget)
        )
        for (e, _), comps in zip(active, outs, strict=True):
            c = comps[0]
            e["ids"] += c.token_ids
            e["lp"] += c.logprobs
            e["mask"] += [1] * len(c.token_ids)
            e["last"], e["turns"] = c, e["turns"] + 1
    rows = []
    for e in eps:
        i = e["i"]
        rows.append(
            {
                "prompt_index": i, "sample_index": e["k"], "task_id": tasks[i]["task_id"], "prompt": prompts[i],
                "answer": tasks[i]["answer"], "seed": seeds[i], "prompt_ids": prompt_ids[i],
                "completion_ids": e["ids"], "logprobs": e["lp"], "loss_mask": e["mask"],
                "completion_text": tok.decode(e["ids"], skip_special_tokens=False),
                "finish_reason": e["last"].finish_reason, "turns": e["turns"], "actions": e["actions"],
                "observations": e["observations"],
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=[*ROLLOUT_COLUMNS, "turns", "actions", "observations"])


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


def outcomes_for(
    env_name: str, rows: list[dict[str, Any]], tasks: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each row's outcome from a fresh environment (pure: runs in any worker process or Ray task).

    Multi-turn rows are replayed from their stored actions, and every observation the environment gives is
    checked against the one the model saw: a difference (a non-hermetic environment) sets ``replay_mismatch``."""
    from envs.base import make_env

    out = []
    for r in rows:
        env = make_env(env_name)
        env.reset(tasks[r["task_id"]], int(r["seed"]))
        key = {"prompt_index": int(r["prompt_index"]), "sample_index": int(r["sample_index"])}
        if "actions" not in r:
            res = env.step(r["completion_text"])
            out.append({**key, "done": res.done, **res.outcome})
            continue
        mismatch, res = False, None
        seen = list(r["observations"])
        for j, action in enumerate(r["actions"]):
            res = env.step(str(action))
            if j < len(seen) and (res.observation or "") != seen[j]:
                mismatch = True
            if res.done:
                break
        outcome = {**(res.outcome if res else {}), "truncated": not (res and res.done)}
        out.append({**key, "done": bool(res and res.done), "turns": int(r["turns"]), "replay_mismatch": mismatch,
                    **outcome})  # fmt: skip
    return out


_POOLS: dict[int, Any] = {}


def _process_pool(workers: int) -> Any:
    """A process pool held for the life of this process (spawned: safe beside the rollout engine's threads)."""
    if workers not in _POOLS:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        from envs.sandbox.pool import exit_with_parent

        _POOLS[workers] = ProcessPoolExecutor(
            workers, mp_context=mp.get_context("spawn"), initializer=exit_with_parent
        )
    return _POOLS[workers]


def _ray_map(address: str, workers: int, env_name: str, chunks: list[list[dict[str, Any]]],
             tasks: dict[str, dict[str, Any]]) -> list[list[dict[str, Any]]]:  # fmt: skip
    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # a local single-node cluster on 127.0.0.1
            ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(PROJECT_ROOT)}})  # fmt: skip
    remote = ray.remote(num_cpus=1)(outcomes_for)
    tasks_ref = ray.put(tasks)
    return ray.get([remote.remote(env_name, c, tasks_ref) for c in chunks])


def env_outcomes(ctx: RunContext, df: pd.DataFrame) -> pd.DataFrame:
    """Outcomes of every row, in row order, computed by ``task.executor``: inline, a local process pool, or Ray."""
    tc = ctx.cfg.task
    cols = [c for c in ("prompt_index", "sample_index", "task_id", "seed", "completion_text", "actions",
                        "observations", "turns") if c in df.columns]  # fmt: skip
    rows = df[cols].to_dict("records")
    for r in rows:
        for c in ("actions", "observations"):
            if c in r:
                r[c] = [str(x) for x in r[c]]
    tasks = {t["task_id"]: t for t in ctx.train_tasks + ctx.heldout_tasks}
    needed = {r["task_id"] for r in rows}
    tasks = {k: v for k, v in tasks.items() if k in needed}
    if tc.executor == "inline" or len(rows) < 2:
        return pd.DataFrame(outcomes_for(tc.env, rows, tasks))
    n_chunks = max(1, min(len(rows), tc.env_workers * 4))
    size = -(-len(rows) // n_chunks)
    chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
    if tc.executor == "ray":
        parts = _ray_map(tc.ray_address, tc.env_workers, tc.env, chunks, tasks)
    else:
        pool = _process_pool(tc.env_workers)
        parts = list(pool.map(outcomes_for, [tc.env] * len(chunks), chunks, [tasks] * len(chunks)))
    return pd.DataFrame([o for part in parts for o in part])


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
