"""The policy update: rollout table -> padded tensors -> policy-gradient steps on a train engine, with the
loss of ``train.algorithm`` (``rl_core.training.algorithms``: PPO-clip, GSPO, CISPO, ...).

``old_logp`` (the PPO anchor) is, by default (``train.old_logprobs: engine``), the rollout engine's own
sampling logprob of each token: no extra forward pass, and with stale rollouts (asynchronous RL) the ratio is
taken against the policy that really sampled them. ``recompute`` has the trainer recompute the anchor before
the first step (as veRL does); an off-policy correction (``train.correction``: tis or mis) then weighs each
token by anchor / behaviour. Either way the rollout/trainer logprob mismatch is reported (with recompute over
the whole batch; with engine logprobs on the first mini-batch, before its step, at no extra cost), the first
thing to look at when an off-policy bug hides in an RL run, with an alarm above ``train.mismatch_alarm``.

    batch = make_batch(df, pad_id=1)
    metrics = ppo_update(engine, batch, train_cfg, seed=7)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from rl_core.models.vision import model_inputs, rows_of, suppress, unsampleable_ids
from rl_core.training.algorithms import algorithm
from rl_core.training.collectives import allreduce_sum
from rl_core.training.logprobs import chunk_positions, logits_stats, token_stats
from rl_core.training.losses import PolicyTerms, importance_weights, policy_loss
from rl_core.training.micro_batches import rank_micro_batches
from rl_core.training.packing import packed_logits, packed_outputs


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] right-padded prompt + completion
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1] 1 where target token t+1 is a model-generated token that carries loss
    rollout_logp: torch.Tensor  # [B, T-1] sampling logprobs from the rollout engine, aligned with loss_mask
    advantages: torch.Tensor  # [B], or [B, T-1] per token (PPO's GAE)
    temperature: float = 1.0
    max_tokens: int | None = None
    ref_logp: torch.Tensor | None = None
    seed: int = 0
    # a vision-language policy's vision tensors, batch-first (rl_core.models.vision.vision_inputs): LLaVA's
    # pixel_values [B, 3, H, W]; Idefics3's pixel_values [B, tiles, 3, H, W] and pixel_attention_mask;
    # Qwen-VL's pixel_values [B, patches, D] and image_grid_thw [B, images, 3]
    vision: dict[str, torch.Tensor] | None = None
    pack_tokens: int | None = None  # forwards on packed rows of this many tokens (0: longest); None: padded
    logits_mb: float = 0.0  # MiB of float32 logits one forward may hold whole; past it, the head in chunks

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def make_batch(
    df: pd.DataFrame,
    *,
    pad_id: int,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    seed: int = 0,
    ckpt_dir: Any = None,
    pack_tokens: int | None = None,
    images: list[tuple[bytes, ...]] | None = None,
    logits_mb: float = 0.0,
) -> Batch:
    """Columns used: prompt_ids, completion_ids, logprobs, loss_mask (per completion token), advantage, and
    image (encoded bytes, turned into pixels by the processor in ``ckpt_dir``) for multimodal rollouts; or
    ``images``: each row's images in sequence order (read from the store by the table's digests), when the
    episodes showed images in several turns.
    ``pack_tokens`` (``rl_core.training.packing.pack_budget``) has the forwards run on packed rows;
    ``logits_mb`` (``train.logits_chunk_mb``) bounds the float32 logits one forward holds at once."""
    prompts, completions = list(df["prompt_ids"]), list(df["completion_ids"])
    n = len(prompts)
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    # Filled row by row in numpy (a slice assignment per row; torch.tensor per row cost ~20x more).
    ids = np.full((n, width), pad_id, dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    lmask = np.zeros((n, width - 1), dtype=np.float32)
    rlp = np.zeros((n, width - 1), dtype=np.float32)
    for i, (p, c, lp, m) in enumerate(
        zip(prompts, completions, df["logprobs"], df["loss_mask"], strict=True)
    ):
        a, b = len(p), len(c)
        if not a:  # the first completion token has no position to be predicted from
            raise ValueError(
                f"rollout row {i} has an empty prompt: a completion needs at least one prompt token"
            )
        ids[i, :a] = p
        ids[i, a : a + b] = c
        attn[i, : a + b] = 1
        if b:  # target position a-1 predicts the first completion token
            lmask[i, a - 1 : a - 1 + b] = m
            rlp[i, a - 1 : a - 1 + b] = lp
    ids, attn, lmask, rlp = (torch.from_numpy(x) for x in (ids, attn, lmask, rlp))
    adv = torch.tensor(
        df["advantage"].to_numpy(dtype=np.float32, copy=True)
    )  # (a reversed view has negative strides)
    pixels = _vision(df, images, ckpt_dir, pack_tokens)
    return Batch(
        ids,
        attn,
        lmask,
        rlp,
        adv,
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed,
        vision=pixels,
        pack_tokens=pack_tokens,
        logits_mb=logits_mb,
    )


def _vision(
    df: pd.DataFrame, images: list[tuple[bytes, ...]] | None, ckpt_dir: Any, pack_tokens: int | None
) -> dict[str, torch.Tensor] | None:
    """The rows' vision tensors (``rl_core.models.vision.vision_inputs``) from ``images`` or the inline
    ``image`` column; None for a text batch."""
    rows = images if images is not None and any(images) else None
    if rows is None and "image" in df.columns:
        rows = [(bytes(b),) for b in df["image"]]
    if rows is None:
        return None
    if ckpt_dir is None:
        raise ValueError("make_batch: rollouts with images need ckpt_dir (its image processor)")
    if pack_tokens is not None:
        raise ValueError("train.packing does not pack vision-language rollouts: set train.packing=false")
    from rl_core.models.vision import vision_inputs

    return vision_inputs(ckpt_dir, rows)


def _logits(
    module: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    pixels: dict[str, torch.Tensor] | None = None,
    pack: int | None = None,
) -> torch.Tensor:
    """``[B, T-1, V]`` next-token logits, the unsampleable ids suppressed; on packed rows of ``pack`` tokens
    unless it is None."""
    return suppress(_model_logits(module, ids, attn, pixels, pack), unsampleable_ids(module))


def _model_logits(
    module: Any, ids: torch.Tensor, attn: torch.Tensor, pixels: dict[str, Any] | None, pack: int | None
) -> torch.Tensor:
    if pack is not None:
        return packed_logits(module, ids, attn, pack, pixels)
    vision = model_inputs(module, ids, attn, pixels)
    return module(input_ids=ids, attention_mask=attn, use_cache=False, **vision).logits[:, :-1]


def _on(t: torch.Tensor, device: Any) -> torch.Tensor:
    """A host tensor on the trainer's device without waiting for the work queued there (a blocking copy
    to a GPU first waits for its stream: a host synchronisation per micro-batch)."""
    return t if device is None else t.to(device, non_blocking=True)


def _stats(
    module: Any, batch: Batch, rows: Any, device: Any, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T-1]`` logprobs of the targets of the batch's ``rows`` (and their entropies, without grad, when
    asked), on ``device``: the head in chunks (``rl_core.training.logprobs``) where the whole float32 logits
    would pass ``batch.logits_mb``, else from the whole logits. Packed rows are laid out from the host's
    copy of the batch, so nothing is read back from the device."""
    host_ids, host_attn = batch.input_ids[rows], batch.attention_mask[rows]
    ids, attn, pixels = _on(host_ids, device), _on(host_attn, device), _pixels(batch, rows, device)
    chunk = chunk_positions(module, batch.logits_mb) if pixels is None else 0
    pack = batch.pack_tokens
    if chunk and ids.shape[0] * (ids.shape[1] - 1) > chunk:

        def packed(base: Any, _i: torch.Tensor, _a: torch.Tensor) -> torch.Tensor:
            run = lambda **kw: base(**kw).last_hidden_state  # noqa: E731
            return packed_outputs(run, host_ids, host_attn, pack, device)  # type: ignore[arg-type]

        fwd = None if pack is None else packed
        return token_stats(module, ids, attn, batch.temperature, chunk, entropy, fwd)
    if pack is not None:
        logits = packed_logits(module, host_ids, host_attn, pack, pixels, device)
    else:
        logits = _model_logits(module, ids, attn, pixels, None)
    # without grad the model's logits are this call's own (with grad its backward may read them: copies)
    own = not torch.is_grad_enabled()
    return logits_stats(logits, ids[:, 1:], batch.temperature, unsampleable_ids(module), entropy, own)


def _pixels(batch: Batch, rows: Any, device: Any) -> dict[str, torch.Tensor] | None:
    if batch.vision is None:
        return None
    return {k: _on(v, device) for k, v in rows_of(batch.vision, rows).items()}


@torch.no_grad()
def sequence_logprobs(
    module: Any, batch: Batch, chunk: int, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs and entropies of the batch's targets under ``module`` (no grad), brought to the
    host once, after the last micro-batch."""
    lps, ents = [], []
    for i in range(0, len(batch), chunk):
        lp, ent = _stats(module, batch, slice(i, i + chunk), device, entropy=True)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps).cpu(), torch.cat(ents).cpu()  # type: ignore[arg-type]


def ppo_update(engine: Any, batch: Batch, cfg: Any) -> dict[str, float]:
    """``cfg.epochs`` passes of mini-batches of ``cfg.micro_batch_size`` sequences, split over DP ranks; each
    rank's share in micro-batches of at most ``cfg.forward_tokens`` tokens / ``cfg.forward_sequences`` rows
    (``rl_core.training.micro_batches``), their gradients accumulated into the mini-batch's one step.

    Long: one PPO update reads best as one piece (old logprobs, the epoch/mini-batch loop, the clipped loss
    with its KL term, the step and the statistics), in the order a reader checks it against the paper."""
    world, rank = engine.world_size, engine.rank
    device = getattr(engine, "device", None)
    mask = batch.loss_mask
    anchor = _Anchor.of(engine, batch, cfg, device)
    old_logp = anchor.old_logp
    surrogate = algorithm(cfg.algorithm).loss
    stats: dict[str, list[float]] = {
        k: [] for k in ("loss", "pg_loss", "clip_frac", "kl", "ratio_mean", "grad_norm")
    }
    costs = _forward_costs(batch)
    idle_forwards = 0.0  # forwards of ranks with fewer micro-batches than the most loaded one (all ranks)
    gen = torch.Generator().manual_seed(batch.seed)
    for epoch in range(cfg.epochs):
        order = torch.randperm(len(batch), generator=gen)
        for start in range(0, len(batch), cfg.micro_batch_size):
            mb = order[start : start + cfg.micro_batch_size]
            seq_has = (mask[mb].sum(1) > 0).float()
            totals = {"token_mean": float(mask[mb].sum()), "seq_mean_token_mean": float(seq_has.sum())}
            total = totals.get(cfg.loss_agg, float(len(mb)))
            if total == 0:
                continue
            groups = rank_micro_batches(
                mb,
                costs,
                world,
                rank,
                getattr(cfg, "forward_tokens", None),
                getattr(cfg, "forward_sequences", None),
            )
            # loss, pg_loss, kl, clip tokens, ratio x tokens of this rank's rows; its idle forwards: summed on
            # the device, read once the mini-batch has stepped (no host synchronisation between micro-batches)
            sums = torch.zeros(6, dtype=torch.float64, device=device)
            grad_norm = float("nan")
            for j, rows in enumerate(groups):
                last = j == len(groups) - 1
                # a rank that needs fewer micro-batches than the most loaded one runs a forward and backward
                # that add nothing (of one row of the mini-batch), so that every rank runs as many (ZeRO-2/3
                # communicate in each)
                idle = not len(rows)
                fwd = mb[:1] if idle else rows
                observe = epoch == 0 and not idle and not anchor.recomputed
                logp, ent = _stats(engine.module, batch, fwd, device, entropy=observe)
                if idle:
                    norm = engine.backward_step(logp.sum() * 0.0, step=last)
                    grad_norm = norm if last else grad_norm
                    sums[5] += 1.0
                    continue
                if observe:
                    anchor.observe(rows, ent, logp, start == 0)  # type: ignore[arg-type]
                ref = _on(batch.ref_logp[rows], device) if batch.ref_logp is not None else None
                terms = PolicyTerms(
                    logp,
                    _on(old_logp[rows], device),
                    _on(batch.advantages[rows], device),
                    _on(mask[rows], device),
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    aggregation=cfg.loss_agg,
                    max_tokens=batch.max_tokens,
                    total=total,
                    is_weight=None if anchor.weight is None else _on(anchor.weight[rows], device),
                )
                loss, s = policy_loss(surrogate, terms, ref, cfg.kl_coef, cfg.kl_estimator)
                # DeepSpeed averages gradients over ranks; scaling by world size makes that the global mean.
                # The micro-batches' losses add up to the mini-batch's (each is normalised by its total).
                grad_norm = engine.backward_step(loss * world, step=last)
                n_local = mask[rows].sum(dtype=torch.float64)  # of the host's mask: nothing read back
                part = [loss, s["pg_loss"], s["kl"], s["clip_frac"] * n_local, s["ratio_mean"] * n_local]
                sums[:5] += torch.stack([_f64(v, device) for v in part])
            loss_g, pg_g, kl_g, clip_g, ratio_g, idle_g = allreduce_sum(
                sums.tolist(), world, getattr(engine, "dp_group", None)
            )
            idle_forwards += idle_g
            tokens = float(mask[mb].sum())
            stats["loss"].append(loss_g)
            stats["pg_loss"].append(pg_g)
            stats["kl"].append(kl_g)
            stats["clip_frac"].append(clip_g / max(tokens, 1.0))
            stats["ratio_mean"].append(ratio_g / max(tokens, 1.0))
            stats["grad_norm"].append(grad_norm)
    out = {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
    out["losses"] = stats["loss"]  # type: ignore[assignment]
    out.update(anchor.metrics(mask, cfg.mismatch_alarm))
    out["optimizer_steps"] = float(len(stats["loss"]))
    out["idle_forwards"] = idle_forwards
    return out


def _f64(value: Any, device: Any) -> torch.Tensor:
    """A statistic as a float64 scalar on the update's device: a tensor's value as it is (exactly, as
    ``float`` would give it), a number (a user's surrogate may report numbers) filled in there."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype=torch.float64).to(device or value.device, non_blocking=True)
    return torch.full((), float(value), dtype=torch.float64, device=device)


def _forward_costs(batch: Batch) -> torch.Tensor:
    """Each row's tokens in a train forward: its real length on packed rows, the batch's width when padded."""
    if batch.pack_tokens is not None:
        return batch.attention_mask.sum(1)
    return torch.full((len(batch),), batch.input_ids.shape[1])


class _Anchor:
    """The PPO anchor of one update, its off-policy weights, and what it reports: the rollout/trainer
    mismatch and the policy's entropy (from the recompute, or else from the first epoch's own forwards)."""

    def __init__(self, batch: Batch, old_logp: torch.Tensor, entropy: torch.Tensor | None, weight: Any):
        self.batch, self.old_logp, self.weight = batch, old_logp, weight
        self.recomputed = entropy is not None
        self.entropy = entropy if entropy is not None else torch.zeros_like(batch.loss_mask)
        self.diff = (old_logp - batch.rollout_logp).abs() * batch.loss_mask if self.recomputed else None
        self.first_rows: Any = None
        # the first epoch's forwards, as they were on the device: read once, by ``metrics``
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    @classmethod
    def of(cls, engine: Any, batch: Batch, cfg: Any, device: Any) -> _Anchor:
        if cfg.old_logprobs == "engine":
            return cls(batch, batch.rollout_logp, None, None)
        old_logp, entropy = sequence_logprobs(engine.module, batch, cfg.micro_batch_size, device)
        weight = None
        if cfg.correction != "none":
            weight = importance_weights(old_logp, batch.rollout_logp, cfg.correction, cfg.is_cap)
        return cls(batch, old_logp, entropy, weight)

    def observe(self, rows: torch.Tensor, entropy: torch.Tensor, logp: torch.Tensor, first: bool) -> None:
        """A first-epoch forward of ``rows``: their entropy; for the first mini-batch (the policy before any
        step of this update) also the mismatch, when the anchor was not recomputed. Kept on the device until
        ``metrics``: nothing is read back between micro-batches."""
        if not self.recomputed:
            self.seen.append((rows, entropy.detach(), logp.detach() if first else None))

    def _gather(self) -> None:
        """The observed forwards into the host's entropy and mismatch: one read, after the update."""
        if not self.seen:
            return
        rows = torch.cat([r for r, _, _ in self.seen])
        self.entropy[rows] = torch.cat([e for _, e, _ in self.seen]).cpu()
        first = [(r, lp) for r, _, lp in self.seen if lp is not None]  # the first mini-batch's, in order
        if first:
            self.first_rows = torch.cat([r for r, _ in first])
            logp = torch.cat([lp for _, lp in first]).cpu()
            gap = logp - self.batch.rollout_logp[self.first_rows]
            self.diff = gap.abs() * self.batch.loss_mask[self.first_rows]
        self.seen = []

    def metrics(self, mask: torch.Tensor, alarm: float) -> dict[str, float]:
        self._gather()
        out = {"entropy": float((self.entropy * mask).sum() / mask.sum().clamp(min=1))}
        seen = mask if self.first_rows is None else mask[self.first_rows]
        diff = self.diff if self.diff is not None else torch.zeros(1)
        out["logprob_mismatch_max"] = float(diff.max()) if diff.numel() else 0.0
        out["logprob_mismatch_mean"] = float(diff.sum() / seen.sum().clamp(min=1))
        out["mismatch_alarm"] = float(out["logprob_mismatch_mean"] > alarm)
        if self.weight is not None:
            out["is_weight_mean"] = float((self.weight * mask).sum() / mask.sum().clamp(min=1))
            out["is_zeroed_frac"] = float(((self.weight == 0).float() * mask).sum() / mask.sum().clamp(min=1))
        return out
