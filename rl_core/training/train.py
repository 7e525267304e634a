"""Stage body for train: one policy update from this iteration's rollouts and rewards.

The train engine is held across iterations (like the rollout engine). It is reused only when it holds
exactly the input policy; otherwise it is rebuilt from the stored checkpoint and optimizer state, so a resumed
run continues from artifacts alone and ends with the same weights as an uninterrupted one.

Checkpoints on a cadence (``train.checkpoint_every: N``): iterations between full checkpoints commit their
manifest with references marked ``stored: false`` (the checkpoint's digest is still its folder's); the weights
stay in the train engine and in memory for the rollout engine, plus a local folder on this machine. Anything
that needs such a checkpoint and does not hold it (a resumed run, a replay, an evaluation sweep on another
machine) rebuilds it with ``rebuild``: the train stages since the last stored checkpoint re-run from their
stored rollouts and rewards, each checked against the digest its manifest recorded.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_core.artifacts import safe_state
from rl_core.artifacts.manifest import ArtifactRef, Manifest
from rl_core.artifacts.seeding import derive_seed
from rl_core.artifacts.stage import StageJob, StageResult, committed, pending_or_done
from rl_core.artifacts.store import ArtifactError, dir_digest, sha256_bytes
from rl_core.models.model import (
    folder_dtype,
    is_tied,
    is_weight_file,
    load_model,
    load_tokenizer,
    pad_id,
    stored_weights,
    weight_files,
    weights_digest,
)
from rl_core.run import context
from rl_core.run.context import RunContext, unstored_dir
from rl_core.training.algorithms import train_advantages, train_rows
from rl_core.training.packing import pack_budget
from rl_core.training.ppo import make_batch, sequence_logprobs
from rl_core.training.train_engine import make_train_engine

log = logging.getLogger("rlfoundry.train")


def _engine_for(ctx: RunContext, policy: ArtifactRef, optimizer: ArtifactRef | None) -> Any:
    held = ctx.held
    want = (policy.sha256, optimizer.sha256 if optimizer else None)
    if held.train is not None and held.train_holds == want and held.train_cfg == ctx.cfg.train:
        return held.train
    if policy.stored is False:  # nor is its optimizer state: re-run the train stages that made them
        rebuild(ctx, policy)
        return held.train
    if held.train is not None:
        held.train.close()  # before the new engine is built: not both in memory
        held.train = None
    placed = ctx.placement.workloads["trainer"]
    # float32, the trainer's own weights: DeepSpeed's bf16 mode casts a copy and keeps these as masters.
    model = load_model(ctx.local_checkpoint(policy), placed)
    state = None
    if optimizer is not None:
        state, masters = read_optimizer_file(ctx.store.read_bytes(optimizer), optimizer.uri)
        if masters is not None:  # the float32 weights the rounded checkpoint was stored from
            _load_masters(model, masters, optimizer.uri)
    tc = ctx.cfg.train
    budget = (ctx.placement.memory or {}).get("forward_tokens")
    if tc.forward_tokens is None and budget:  # the memory plan's forward on a GPU (accumulated gradients)
        tc = tc.model_copy(update={"forward_tokens": budget})
    engine = make_train_engine(tc.backend, model, tc, placed.device)
    if state is not None:
        engine.load_optimizer_tree(state, optimizer.uri)
    held.train, held.train_cfg = engine, ctx.cfg.train.model_copy()
    return engine


# The optimizer artifact beside a checkpoint stored in less than float32 (a bf16 folder stays bf16) holds the
# float32 weights under this key: a resume continues from them, bit for bit where the uninterrupted run is.
MASTERS = "fp32_master_weights"


def optimizer_file(state: bytes, masters: dict[str, Any] | None) -> bytes:
    """The optimizer artifact: the engine's state file, with ``masters`` when the checkpoint is rounded."""
    if masters is None:
        return state
    return safe_state.dumps({"state": safe_state.loads(state, "optimizer state"), MASTERS: masters})


def read_optimizer_file(data: bytes, what: str) -> tuple[Any, dict[str, Any] | None]:
    """The optimizer state tree and the float32 master weights (None when the file holds none)."""
    tree = safe_state.loads(data, what)
    if isinstance(tree, dict) and MASTERS in tree:
        if set(tree) != {"state", MASTERS}:
            raise ValueError(f"{what}: unexpected keys beside the master weights: {sorted(tree)}")
        return tree["state"], tree[MASTERS]
    return tree, None


def _load_masters(model: Any, masters: dict[str, Any], what: str) -> None:
    """Put the float32 ``masters`` into ``model`` (just loaded from the rounded checkpoint)."""
    import torch

    if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in masters.values()):
        raise ValueError(f"{what}: the master weights are not all float32 tensors")
    missing, unexpected = model.load_state_dict(masters, strict=False)
    own = model.state_dict()  # a tied output embedding may be named once: the same tensor as a loaded one
    loaded = {own[k].data_ptr() for k in masters if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded]
    if unexpected or missing:
        raise ValueError(
            f"{what}: its master weights do not fit the checkpoint's model "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )


def _engine_asleep(ctx: RunContext) -> None:
    """The rollout engine and the LLM judge's, colocated on the trainer's GPU, give their memory back while
    the trainer steps (vLLM's sleep mode; rl_core.models.placement plans the GPU's memory so); the next
    generate (the next judging) wakes them."""
    if not ctx.placement.colocated:
        return
    held = ctx.held
    judge = held.judge.engine if held.judge is not None else None
    for lock, engine in ((held.engine_lock, held.rollout), (held.judge_lock, judge)):
        if engine is not None:
            with lock:
                sleep = getattr(engine, "sleep", None)
                if sleep is not None:
                    sleep()


def _reference(ctx: RunContext, ref_ckpt: ArtifactRef) -> Any:
    if ctx.held.reference is None or ctx.held.reference[0] != ref_ckpt.sha256:
        placed = ctx.placement.workloads["reference"]
        model = load_model(ctx.local_checkpoint(ref_ckpt), placed, placed.dtype)
        ctx.held.reference = (ref_ckpt.sha256, model.eval())
    return ctx.held.reference[1]


def _off_policy(cfg: Any, rollouts: Any, iteration: int, metrics: dict[str, float]) -> dict[str, float]:
    """Which policy version sampled the rollouts, how stale they are, and the alarms (logged as warnings).

    The schedule fixes the lag: iteration k trains on rollouts of policy k-1-K (K = rollout.max_staleness; the
    warm-up policy, version 0, while k-1-K < 0). ``staleness_alarm`` fires when the rollouts were sampled by
    any other version — older or newer, or by several — i.e. when the rollouts this stage reads are not the
    ones the schedule says (another iteration's artifact, a run resumed with another K), not by construction.

    >>> from rl_core.schema.config import Config
    >>> import pandas as pd
    >>> cfg = Config.model_validate({"rollout": {"max_staleness": 1}})
    >>> def alarm(versions, k):
    ...     return _off_policy(cfg, pd.DataFrame({"policy_version": versions}), k, {})["staleness_alarm"]
    >>> [alarm(v, 3) for v in ([1], [0], [2], [1, 0])], alarm([0], 1)  # at 1: the warm-up policy
    ([0.0, 1.0, 1.0, 1.0], 0.0)
    """
    out: dict[str, float] = {}
    if "policy_version" in rollouts.columns:
        versions = rollouts["policy_version"]
        version = int(versions.min())
        expected = max(0, iteration - 1 - cfg.rollout.max_staleness)
        out = {"rollout_policy_version": version, "staleness": iteration - 1 - version}
        out["staleness_alarm"] = float(version != expected or int(versions.max()) != version)
    if metrics.get("mismatch_alarm"):
        log.warning(
            "iteration %d: rollout/trainer logprob mismatch %.4g > train.mismatch_alarm %.4g",
            iteration,
            metrics["logprob_mismatch_mean"],
            cfg.train.mismatch_alarm,
        )
    if out.get("staleness_alarm"):
        log.warning(
            "iteration %d: rollouts of policy version %d, the schedule's is %d (rollout.max_staleness %d)",
            iteration,
            out["rollout_policy_version"],
            max(0, iteration - 1 - cfg.rollout.max_staleness),
            cfg.rollout.max_staleness,
        )
    return out


def stores_checkpoint(cfg: Any, iteration: int) -> bool:
    """Whether ``iteration`` writes its full checkpoint (every ``train.checkpoint_every``, and the last one).

    >>> from rl_core.schema.config import Config
    >>> cfg = Config.model_validate({"experiment": {"iterations": 7}, "train": {"checkpoint_every": 3}})
    >>> [k for k in range(1, 8) if stores_checkpoint(cfg, k)]
    [3, 6, 7]
    """
    return iteration % cfg.train.checkpoint_every == 0 or iteration == cfg.experiment.iterations


def _update(ctx: RunContext, job: StageJob) -> tuple[Any, dict[str, Any], dict[str, bytes]]:
    """One policy update on the job's rollouts: the train engine (now holding the new policy), metrics, and
    the algorithm's extra outputs (PPO's critic)."""
    cfg, inputs, iteration = ctx.cfg, job.inputs, job.iteration
    policy = inputs["policy"]
    rollouts = ctx.store.read_table(inputs["rollouts"])
    rewards = ctx.store.read_table(inputs["rewards"])
    if len(rollouts) != len(rewards):
        raise ValueError(
            f"rewards {inputs['rewards'].uri} do not line up with rollouts {inputs['rollouts'].uri}"
        )
    df, pg_metrics = train_rows(rollouts, rewards)
    seed = derive_seed(cfg.experiment.seed, iteration, "train")
    _engine_asleep(ctx)
    engine = _engine_for(ctx, policy, inputs.get("optimizer"))
    if len(df) == 0:  # dynamic sampling dropped every group: nothing to learn, the policy passes through
        return engine, {**pg_metrics, "optimizer_steps": 0.0, "first_step_loss": 0.0}, {}
    local = ctx.local_checkpoint(policy)
    images = None
    if "images" in df.columns:  # images in several turns: by digest, from the run's store
        from rl_core.artifacts.images import row_images

        run_uri = ctx.store.run_uri(ctx.run_id)
        images = [row_images(ctx.store, run_uri, turns) for turns in df["images"]]
    batch = make_batch(
        df,
        pad_id=pad_id(load_tokenizer(local)),
        temperature=cfg.rollout.temperature,
        max_tokens=cfg.rollout.max_tokens,
        seed=seed,
        ckpt_dir=local,
        pack_tokens=pack_budget(cfg.train),
        images=images,
        logits_mb=cfg.train.logits_chunk_mb,
    )
    if "reference" in inputs and cfg.train.kl_coef > 0:
        batch.ref_logp, _ = sequence_logprobs(
            _reference(ctx, inputs["reference"]),
            batch,
            cfg.train.micro_batch_size,
            ctx.placement.workloads["reference"].device,
        )
    pg_more, extra = train_advantages(ctx, job, batch, df)
    metrics = engine.train(batch) | pg_metrics | pg_more
    losses = metrics.pop("losses")
    metrics.update(_off_policy(cfg, rollouts, iteration, metrics))
    metrics["first_step_loss"] = losses[0] if losses else 0.0
    metrics["step_losses"] = losses
    return engine, metrics, extra


def _carried(src: Path) -> list[Path]:
    """The files of the parent checkpoint folder a new one keeps as they are: all but the weights (and the
    cache's own markers)."""
    keep = (f for f in Path(src).iterdir() if f.is_file() and not is_weight_file(f.name))
    return sorted(f for f in keep if not f.name.startswith("."))


def checkpoint_files(ctx: RunContext, job: StageJob, weights: dict[str, Any]) -> dict[str, bytes]:
    """The new checkpoint folder's files: the input policy's with the new weights."""
    src = ctx.local_checkpoint(job.inputs["policy"])
    kept = {f.name: f.read_bytes() for f in _carried(src)}
    return kept | weight_files(weights, is_tied(src), ctx.cfg.model.max_shard_bytes)


def store_checkpoint(ctx: RunContext, job: StageJob, weights: dict[str, Any]) -> ArtifactRef:
    """Write the checkpoint folder from memory straight into the store (each file written and hashed once)."""
    return ctx.store.put_files(checkpoint_files(ctx, job, weights), f"{job.out_uri}/checkpoint")


def _store(
    ctx: RunContext, job: StageJob, engine: Any, weights: dict[str, Any], masters: dict[str, Any] | None
) -> tuple[ArtifactRef, ArtifactRef, list[Callable[[], None]]]:
    """The checkpoint folder and optimizer state (with the float32 ``masters`` of a rounded one): references
    hashed now, and the writes the stage's commit does (``StageResult.pending``)."""
    ref, writes = ctx.store.planned_files(checkpoint_files(ctx, job, weights), f"{job.out_uri}/checkpoint")
    data = optimizer_file(engine.optimizer_state(), masters)
    opt_ref, opt_write = ctx.store.planned(f"{job.out_uri}/optimizer.safetensors", data)
    return ref, opt_ref, [*writes, opt_write]


def checkpoint_weights(ctx: RunContext, job: StageJob, trained: dict[str, Any]) -> tuple[dict, dict | None]:
    """The weights the new checkpoint stores, in the input policy's dtype (what the rollout engine gets too,
    so that a replay from the folder samples as the run did), and the trainer's float32 weights when those
    are rounded (None when the folder is float32)."""
    stored = stored_weights(trained, folder_dtype(ctx.local_checkpoint(job.inputs["policy"])))
    return stored, (None if stored is trained else trained)


def _hold(ctx: RunContext, job: StageJob, weights: dict[str, Any]) -> tuple[ArtifactRef, ...]:
    """References to a checkpoint and optimizer state that stay in memory (not stored): the checkpoint's
    digest is the one its folder would have had; a local copy of the folder is written for this machine's
    readers (the rollout engine's tokenizer, evaluation)."""
    policy = job.inputs["policy"]
    src = ctx.local_checkpoint(policy)
    carried = _carried(src)
    data = weight_files(weights, is_tied(src), ctx.cfg.model.max_shard_bytes)
    files = {f.name: (policy.files or {})[f.name] for f in carried} | {
        n: sha256_bytes(b) for n, b in data.items()
    }
    ref = ArtifactRef(uri=f"{job.out_uri}/checkpoint", sha256=dir_digest(files), files=files, stored=False)
    dest = unstored_dir(ref)
    if not (dest / ".complete").exists():
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".held-"))
        for f in carried:
            shutil.copy(f, tmp / f.name)
        for n, b in data.items():
            (tmp / n).write_bytes(b)
        (tmp / ".complete").touch()
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
        for n, b in data.items():  # their pages handed back once on disk, as the store's (page_cache)
            ctx.store.pages.wrote(str(dest / n), len(b))
    name = f"optimizer state after iteration {job.iteration} with checkpoint {ref.sha256}"
    uri = f"{job.out_uri}/optimizer.safetensors"
    opt = ArtifactRef(uri=uri, sha256=sha256_bytes(name.encode()), stored=False)
    return ref, opt


def _step(ctx: RunContext, job: StageJob) -> tuple[ArtifactRef, ArtifactRef, dict[str, Any], dict, list]:
    """The update: the new checkpoint, optimizer state, metrics, the algorithm's extra outputs (PPO's
    critic, stored at every iteration), and the writes of the stored ones still to do."""
    engine, metrics, extra = _update(ctx, job)
    weights, masters = checkpoint_weights(ctx, job, engine.weights())
    writes: list[Callable[[], None]] = []
    if stores_checkpoint(ctx.cfg, job.iteration):
        ref, opt_ref, writes = _store(ctx, job, engine, weights, masters)
    else:
        ref, opt_ref = _hold(ctx, job, weights)
    extra_refs = {k: ctx.store.write_bytes(f"{job.out_uri}/{k}.safetensors", v) for k, v in extra.items()}
    # As many as an asynchronous generate may still read (the policy max_staleness versions back), plus one.
    ctx.held.remember(weights_digest(ref.files), weights, keep=ctx.cfg.rollout.max_staleness + 2)
    ctx.held.train_holds = (ref.sha256, opt_ref.sha256)
    return ref, opt_ref, metrics, extra_refs, writes


def _unstored_chain(ctx: RunContext, ref: ArtifactRef) -> list[Manifest]:
    """The committed train stages to re-run, in order, to rebuild the unstored checkpoint ``ref``: back from
    the one that made it to the first whose inputs are stored (or held by the train engine now)."""
    found = None
    for k in range(ctx.cfg.experiment.iterations, 0, -1):
        m = committed(ctx.store, ctx.run_id, k, "train")
        if m is not None and m.outputs["checkpoint"].same_artifact(ref):
            found = m
            break
    if found is None:
        raise ArtifactError(
            f"checkpoint {ref.uri} was not stored (train.checkpoint_every) and no committed train stage of "
            f"run {ctx.run_id} made it: it cannot be rebuilt"
        )
    chain = [found]
    while True:
        policy, opt = chain[-1].inputs["policy"], chain[-1].inputs.get("optimizer")
        if policy.stored is not False or ctx.held.train_holds == (policy.sha256, opt and opt.sha256):
            return chain[::-1]
        prev = committed(ctx.store, ctx.run_id, chain[-1].iteration - 1, "train")
        if prev is None:
            raise ArtifactError(f"rebuilding {ref.uri}: the train stage before {chain[-1].stage} is missing")
        chain.append(prev)


def rebuild(ctx: RunContext, ref: ArtifactRef) -> None:
    """Rebuild an unstored checkpoint (and the optimizer state beside it) by re-running the train stages since
    the last stored one from their stored inputs; the train engine is left holding it and its local folder
    is written. Each re-run must reproduce the digest its manifest recorded, bit for bit."""
    with ctx.held.train_lock:
        holds = ctx.held.train_holds
        if holds is not None and holds[0] == ref.sha256 and (unstored_dir(ref) / ".complete").exists():
            return  # rebuilt meanwhile (by the stage running beside the caller)
        chain = _unstored_chain(ctx, ref)
        log.info("rebuilding %s: re-running train of iterations %s", ref.uri, [m.iteration for m in chain])
        for m in chain:
            out = ctx.store.stage_uri(ctx.run_id, m.iteration, "train")
            got, *_, writes = _step(ctx, StageJob(m.iteration, m.inputs, out))
            for write in writes:  # (none: an unstored checkpoint is held, not written)
                write()
            want = m.outputs["checkpoint"]
            if got.sha256 != want.sha256:
                raise ArtifactError(
                    f"rebuilding {want.uri}: re-running train of iteration {m.iteration} gave folder digest "
                    f"{got.sha256[:16]}..., its manifest says {want.sha256[:16]}... (not reproducible here)"
                )


def train_body(ctx: RunContext, job: StageJob) -> StageResult:
    if ctx.cfg.train.launched and ctx.cfg.cluster.ray_address:  # its ranks as actors on a Ray cluster
        from rl_core.training.ray_launch import launch_train_on_ray

        return launch_train_on_ray(ctx, job)
    if ctx.cfg.train.launched:  # train.world_size / tp_size > 1: a torchrun job of its own
        from rl_core.training.train_launch import launch_train

        return launch_train(ctx, job)
    with ctx.held.train_lock:
        ref, opt_ref, metrics, extra, writes = _step(ctx, job)
    return StageResult(
        outputs={"checkpoint": ref, "optimizer": opt_ref, **extra},
        metrics={**metrics, "policy_sha256": weights_digest(ref.files), "world_size": 1, "tp_size": 1},
        seeds={"train": derive_seed(ctx.cfg.experiment.seed, job.iteration, "train")},
        pending=pending_or_done(writes),  # left to the commit when run_stage writes behind, else done
    )


context.REBUILD_UNSTORED = rebuild  # RunContext.local_checkpoint rebuilds unstored checkpoints with it
