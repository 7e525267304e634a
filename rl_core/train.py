"""Stage body for train: one policy update from this iteration's rollouts and rewards.

The train engine is held across iterations (like the rollout engine). It is reused only when it holds
exactly the input policy; otherwise it is rebuilt from the stored checkpoint and optimizer state, so a resumed
run continues from artifacts alone and ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rl_core.context import RunContext
from rl_core.manifest import ArtifactRef
from rl_core.model import WEIGHTS, load_model, load_tokenizer, save_weights
from rl_core.ppo import make_batch, sequence_logprobs
from rl_core.seeding import derive_seed
from rl_core.stage import StageJob, StageResult
from rl_core.train_engine import make_train_engine

log = logging.getLogger("rlfoundry.train")


def _engine_for(ctx: RunContext, policy: ArtifactRef, optimizer: ArtifactRef | None) -> Any:
    held = ctx.held
    want = (policy.sha256, optimizer.sha256 if optimizer else None)
    if held.train is not None and held.train_holds == want and held.train_cfg == ctx.cfg.train:
        return held.train
    model = load_model(ctx.local_checkpoint(policy))
    engine = make_train_engine(ctx.cfg.train.backend, model, ctx.cfg.train)
    if optimizer is not None:
        engine.load_optimizer_state(ctx.store.read_bytes(optimizer))
    held.train, held.train_cfg = engine, ctx.cfg.train.model_copy()
    return engine


def _reference(ctx: RunContext, ref_ckpt: ArtifactRef) -> Any:
    if ctx.held.reference is None or ctx.held.reference[0] != ref_ckpt.sha256:
        ctx.held.reference = (ref_ckpt.sha256, load_model(ctx.local_checkpoint(ref_ckpt)).eval())
    return ctx.held.reference[1]


def _off_policy(cfg: Any, rollouts: Any, iteration: int, metrics: dict[str, float]) -> dict[str, float]:
    """Which policy version sampled the rollouts, how stale they are, and the alarms (logged as warnings)."""
    out: dict[str, float] = {}
    if "policy_version" in rollouts.columns:
        version = int(rollouts["policy_version"].min())
        out = {"rollout_policy_version": version, "staleness": iteration - 1 - version}
        out["staleness_alarm"] = float(out["staleness"] > cfg.rollout.max_staleness)
    if metrics.get("mismatch_alarm"):
        log.warning(
            "iteration %d: rollout/trainer logprob mismatch %.4g > train.mismatch_alarm %.4g",
            iteration,
            metrics["logprob_mismatch_mean"],
            cfg.train.mismatch_alarm,
        )
    if out.get("staleness_alarm"):
        log.warning(
            "iteration %d: rollouts are %d policy versions old > rollout.max_staleness %d",
            iteration,
            out["staleness"],
            cfg.rollout.max_staleness,
        )
    return out


def train_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg, inputs, iteration = ctx.cfg, job.inputs, job.iteration
    policy = inputs["policy"]
    rollouts = ctx.store.read_table(inputs["rollouts"])
    rewards = ctx.store.read_table(inputs["rewards"])
    if len(rollouts) != len(rewards):
        raise ValueError(
            f"rewards {inputs['rewards'].uri} do not line up with rollouts {inputs['rollouts'].uri}"
        )
    df = rollouts.assign(advantage=rewards["advantage"].to_numpy())
    seed = derive_seed(cfg.experiment.seed, iteration, "train")
    engine = _engine_for(ctx, policy, inputs.get("optimizer"))
    pad = load_tokenizer(ctx.local_checkpoint(policy)).pad_token_id
    batch = make_batch(
        df,
        pad_id=pad,
        temperature=cfg.rollout.temperature,
        max_tokens=cfg.rollout.max_tokens,
        seed=seed,
        ckpt_dir=ctx.local_checkpoint(policy),
    )
    if "reference" in inputs and cfg.train.kl_coef > 0:
        batch.ref_logp, _ = sequence_logprobs(
            _reference(ctx, inputs["reference"]), batch, cfg.train.micro_batch_size
        )
    metrics = engine.train(batch)
    losses = metrics.pop("losses")
    metrics.update(_off_policy(cfg, rollouts, iteration, metrics))
    src = ctx.local_checkpoint(policy)
    with tempfile.TemporaryDirectory() as d:
        for f in Path(src).iterdir():
            if f.is_file() and f.name != WEIGHTS and not f.name.startswith("."):
                shutil.copy(f, Path(d) / f.name)
        weights = engine.weights()
        save_weights(weights, d)
        ref = ctx.store.put_dir(d, f"{job.out_uri}/checkpoint")
    ctx.held.fresh_weights = (ref.files[WEIGHTS], weights)
    opt_ref = ctx.store.write_bytes(f"{job.out_uri}/optimizer.pt", engine.optimizer_state())
    ctx.held.train_holds = (ref.sha256, opt_ref.sha256)
    metrics["first_step_loss"] = losses[0] if losses else 0.0
    return StageResult(
        outputs={"checkpoint": ref, "optimizer": opt_ref},
        metrics={**metrics, "policy_sha256": ref.files[WEIGHTS]},
        seeds={"train": seed},
    )
