"""Episodes: the stage body of generate, and the one loop that samples episodes.

generate: choose this iteration's prompts (derived seed; uniformly, or weighted by the curriculum state of the
previous iteration: ``rl_core.generation.curriculum``), ask the run's rollout engine for ``n`` completions
per prompt (a derived seed per request) and store token ids and sampling logprobs as produced; single-turn
is the ``max_turns == 1`` case of the multi-turn loop over ``Episode`` records.
(Outcomes: ``rl_core.generation.outcomes``; rewards: ``rl_core.scoring.rewards``.)
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from envs.base import Epochs, make_env, turns
from rl_core.artifacts.faults import iteration_of
from rl_core.artifacts.images import put_images
from rl_core.artifacts.manifest import ArtifactRef
from rl_core.artifacts.seeding import derive_seed
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.generation.curriculum import choose
from rl_core.generation.rollout import Completion, Request, SamplingSpec, start_engine, sync_weights
from rl_core.generation.turns import Prompts, more_turns, prompts_for
from rl_core.models.model import (
    load_tokenizer,
    prompt_text,
    uses_chat_template,
    weights_digest,
)
from rl_core.run.context import RunContext

ROLLOUT_COLUMNS = [
    "prompt_index",
    "sample_index",
    "task_id",
    "prompt",
    "answer",
    "seed",
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "loss_mask",
    "completion_text",
    "finish_reason",
]
# ``final``: how the environment's last step left the episode (``outcomes.final_of``), for the replay to check
MULTI_TURN_COLUMNS = ["turns", "actions", "observations", "final"]


def policy_engine(
    ctx: RunContext, ckpt: ArtifactRef, iteration: int | None = None, local: Path | None = None
) -> Any:
    """The run's rollout engine (started on first use, held by the context), synced to the checkpoint;
    ``local``: its folder, where the caller has it verified already (``RunContext.local_checkpoint`` hashes a
    folder written moments ago again, its weights file whole)."""
    local = local or ctx.local_checkpoint(ckpt)
    if ctx.held.rollout is None:
        ctx.held.rollout = _servers(ctx, local) or start_engine(
            ctx.placement.rollout_engine,
            local,
            ctx.cfg.rollout,
            max_model_len=ctx.max_model_len(),
            placement=ctx.placement,
        )
    wake = getattr(ctx.held.rollout, "wake", None)
    if wake is not None:  # colocated on the trainer's GPU: asleep since the last train stage
        wake()
    digest = weights_digest(ckpt.files)
    weights = ctx.held.fresh.get(digest)  # the trainer's output, still in memory: no reload from disk
    sync_weights(ctx.held.rollout, local, digest, iteration, weights, ref=ckpt)
    return ctx.held.rollout


def _servers(ctx: RunContext, local: Any) -> Any:
    """The rollout servers' client when the config asks for servers: those of ``rollout.server_urls``, or
    ``rollout.servers`` started by the context's launcher. None for the in-process engine, and also where
    nothing can start servers (replay of one stage): the in-process engine then samples bit for bit alike."""
    r = ctx.cfg.rollout
    if not (r.server_urls or r.servers):
        return None
    if r.servers and ctx.cfg.cluster.ray_address:  # the engines as actors on the run's Ray cluster
        from rl_core.generation.ray_engines import RayEngines

        return RayEngines(ctx, local)
    if r.servers and ctx.placement.rollout_engine == "hf":  # one machine: the N engines' shards in turn
        from rl_core.generation.ray_engines import Shards

        return Shards(
            start_engine("hf", local, r, max_model_len=ctx.max_model_len(), placement=ctx.placement),
            r.servers,
        )
    if r.engine == "hf":
        raise ValueError("rollout.server_urls serve vLLM: set rollout.engine=vllm or auto (is hf)")
    from rl_core.generation.rollout_server import ROLLOUT_TOKEN_ENV, ServerEngine
    from rl_core.models.vision import allowed_token_ids

    allowed = allowed_token_ids(local)
    if r.server_urls:  # the servers' token comes from the flow's environment (a Secret), never the config
        token = os.environ.get(ROLLOUT_TOKEN_ENV, "")
        return ServerEngine(
            r.server_urls, local, allowed_token_ids=allowed, token=token, store_root=ctx.store.root
        )
    if ctx.server_launcher is None:
        return None
    urls, restart, stop, token = ctx.server_launcher(str(local))
    return ServerEngine(
        urls,
        local,
        allowed_token_ids=allowed,
        restart=restart,
        on_close=stop,
        token=token,
        store_root=ctx.store.root,
    )


@dataclass
class Episode:
    """One sampled episode: the token ids after the prompt (the model's turns and, between them, the
    environment's observations), their sampling logprobs (0 for observation tokens) and loss mask."""

    prompt_index: int
    sample_index: int
    ids: list[int]
    logprobs: list[float]
    mask: list[int]
    last: Completion  # the engine's last turn
    env: Any = None  # the episode's own environment (multi-turn)
    turns: int = 1
    done: bool = False
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    final: str = "open"  # outcomes.final_of(the environment's last step)
    # where the folder's processor expands images (Idefics3): ``ids`` with each image's one marker unexpanded
    # (what vLLM is given), and the images each observation showed, in order
    raw: list[int] = field(default_factory=list)
    shown: list[tuple[bytes, ...]] = field(default_factory=list)

    def row(
        self,
        task: dict[str, Any],
        prompt: str,
        seed: int,
        prompt_ids: list[int],
        text: str,
        *,
        multi_turn: bool,
    ) -> dict[str, Any]:
        """The episode's rollout row (``ROLLOUT_COLUMNS``, plus ``MULTI_TURN_COLUMNS`` when multi-turn)."""
        row = {
            "prompt_index": self.prompt_index,
            "sample_index": self.sample_index,
            "task_id": task["task_id"],
            "prompt": prompt,
            "answer": task["answer"],
            "seed": seed,
            "prompt_ids": prompt_ids,
            "completion_ids": self.ids,
            "logprobs": self.logprobs,
            "loss_mask": self.mask,
            "completion_text": text,
            "finish_reason": self.last.finish_reason,
        }
        if multi_turn:
            row.update(turns=self.turns, actions=self.actions, observations=self.observations)
            row["final"] = self.final
        return row

    def add(self, ids: list[int], logprobs: list[float], trained: bool, raw: list[int] | None = None) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [int(trained)] * len(ids)
        self.raw += ids if raw is None else raw

    def images(self) -> tuple[bytes, ...]:
        """Every image the observations showed so far, in order."""
        return tuple(b for turn in self.shown for b in turn)


def sample_table(
    ctx: RunContext,
    ckpt: ArtifactRef,
    tasks: list[dict[str, Any]],
    spec: SamplingSpec,
    seeds: list[int],
    iteration: int | None = None,
    engine: Any = None,
) -> pd.DataFrame:
    """``spec.n`` episodes for each task, one row per episode, token ids as the engine produced them (the
    run's policy engine, or ``engine``: the warm-up's teacher, ``rl_core.generation.turns.Scripted``).

    Turn 1 samples ``n`` completions per prompt from the prompt's seed. A single-turn environment's episode
    ends there (``max_turns`` 1). In a multi-turn one the engine and the environment then alternate: each
    observation's tokens are appended after the model's turn with loss_mask 0 and logprob 0, so the stored
    sequence is exactly what the engine was conditioned on (never re-tokenized)."""
    env, max_turns = ctx.env, turns(ctx.env)
    local = ctx.local_checkpoint(ckpt)
    tok = load_tokenizer(local)
    given = [env.reset(t, s) for t, s in zip(tasks, seeds, strict=True)]  # texts or chat messages
    given, shown = prompts_for(ctx, local, tok, given, tasks, max_turns)
    # One user of the engine at a time (asynchronous RL generates the next iteration while this one
    # evaluates), each with the weights it asked for.
    with ctx.held.engine_lock:
        engine = engine or policy_engine(ctx, ckpt, iteration, local)
        engine.stats()  # the engine's counters so far are its earlier users': this batch's start here
        reqs = [
            Request(ids, s, im, u)
            for ids, s, im, u in zip(shown.ids, seeds, shown.images, shown.unexpanded, strict=True)
        ]
        episodes = [
            Episode(
                i, k, list(c.token_ids), list(c.logprobs), [1] * len(c.token_ids), c, raw=list(c.token_ids)
            )
            for i, comps in enumerate(engine.generate(reqs, spec))
            for k, c in enumerate(comps)
        ]
        if max_turns > 1:
            for ep in episodes:
                ep.env = make_env(ctx.cfg.task.env, ctx.cfg.task.env_args)
                ep.env.reset(tasks[ep.prompt_index], seeds[ep.prompt_index])
            # an observation is a turn of the chat template where the prompt was rendered with it
            templated = [uses_chat_template(tok, p, ctx.cfg.model.chat_template) for p in given]
            more_turns(episodes, engine, tok, shown, seeds, spec, ctx.max_model_len(), max_turns, templated)
        stats = engine.stats()  # this batch's own (the rollout servers' prefix cache)
    prompts = [prompt_text(tok, p) for p in given]
    table = _table(ctx, tok, episodes, tasks, prompts, seeds, shown, max_turns)
    table.attrs["engine_stats"] = stats
    return table


def _table(
    ctx: RunContext,
    tok: Any,
    episodes: list[Episode],
    tasks: list[dict[str, Any]],
    prompts: list[str],
    seeds: list[int],
    shown: Prompts,
    max_turns: int,
) -> pd.DataFrame:
    """The episodes' rows: a single-turn row keeps its prompt's image inline (``image``); episodes that
    saw images in several turns keep each turn's digests (``images``), the pictures stored once each."""
    rows = []
    for ep in episodes:
        i = ep.prompt_index
        # one engine turn: the engine's own text; several: the whole sequence, observations included
        text = ep.last.text if max_turns == 1 else tok.decode(ep.ids, skip_special_tokens=False)
        row = ep.row(tasks[i], prompts[i], seeds[i], shown.ids[i], text, multi_turn=max_turns > 1)
        if shown.images[i] and max_turns == 1:
            row["image"] = shown.images[i][0]
        elif shown.images[i] or ep.shown:  # each turn's images by digest, the prompt's first
            run_uri = ctx.store.run_uri(ctx.run_id)
            row["images"] = [put_images(ctx.store, run_uri, t) for t in (shown.images[i], *ep.shown)]
        rows.append(row)
    extra = list(MULTI_TURN_COLUMNS) if max_turns > 1 else (["image"] if any(shown.images) else [])
    if any("images" in r for r in rows):
        extra += ["images"]
        for r in rows:
            r.setdefault("images", [])
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS + extra)


def generate_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg, iteration = ctx.cfg, job.iteration
    pick_seed = derive_seed(cfg.experiment.seed, iteration, "generate", "prompts")
    pool: dict[str, Any] = {}
    if cfg.rollout.curriculum == "none" and isinstance(ctx.env, Epochs) and ctx.env.order == "epochs":
        # a dataset: every training prompt once per epoch, the order a function of (seed, iteration) alone
        from envs.dataset import epoch_order

        n, per = len(ctx.train_tasks), cfg.rollout.prompts_per_iteration
        chosen = epoch_order(n, per, iteration, cfg.experiment.seed)
        pool = {"epoch": iteration * per / n}
    elif cfg.rollout.curriculum == "none":
        chosen = random.Random(pick_seed).sample(
            range(len(ctx.train_tasks)), cfg.rollout.prompts_per_iteration
        )
    else:  # weighted by the curriculum state committed at iteration k-1 (rl_core.generation.curriculum)
        chosen, pool = choose(ctx, job.inputs.get("curriculum"), iteration, pick_seed)
    tasks = [ctx.train_tasks[i] for i in chosen]
    seeds = [derive_seed(cfg.experiment.seed, iteration, "generate", i) for i in range(len(tasks))]
    r = cfg.rollout
    spec = SamplingSpec(n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)
    policy = job.inputs["policy"]
    version = iteration_of(policy.uri) or 0  # the warm-up checkpoint (iteration 0 of the base) is version 0
    df = sample_table(ctx, policy, tasks, spec, seeds, iteration).assign(policy_version=version)
    engine_stats = df.attrs.pop("engine_stats", {})  # not in the table: its bytes are the samples only
    ref = ctx.store.write_table(f"{job.out_uri}/rollouts.parquet", df)
    lengths = df["completion_ids"].map(len)
    return StageResult(
        outputs={"rollouts": ref},
        metrics={
            **engine_stats,
            "rollout_engine": ctx.placement.rollout_engine,
            "policy_version": version,
            "staleness": iteration - 1 - version,
            "completions": len(df),
            "tokens": int(lengths.sum()),
            "mean_completion_tokens": float(lengths.mean()),
            "stop_fraction": float((df["finish_reason"] == "stop").mean()),
            **pool,
        },
        seeds={
            "prompts": pick_seed,
            "requests": "derive_seed(run_seed, iteration, 'generate', prompt_index)",
        },
    )
