"""Advantages, the policy-gradient surrogates (PPO-clip, GSPO, CISPO) and KL estimators.

The algorithms that combine them are registered in ``rl_core.training.algorithms``.

All per-token tensors are ``[batch, tokens]`` with a 0/1 ``mask`` marking the tokens that carry loss (the
model's own completion tokens; prompt, padding and environment observations are 0).

>>> import numpy as np
>>> group_advantages(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1]), scale_by_std=False).tolist()
[0.5, -0.5, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rl_core.schema.config_pg import Aggregation  # the loss aggregations, declared with the schema

KLKind = Literal["k1", "k2", "k3"]


def group_advantages(
    rewards: np.ndarray, group_ids: np.ndarray, *, scale_by_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """GRPO: ``(r - mean_g) / (std_g + eps)``; Dr.GRPO (``scale_by_std=False``): ``r - mean_g``.

    The std is the population std (ddof=0) of the group; a group whose rewards are all equal gets 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    adv = np.zeros_like(rewards)
    for g in np.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        centred = r - r.mean()
        adv[idx] = centred / (r.std() + eps) if scale_by_std else centred
    return adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    how: Aggregation,
    max_tokens: int | None = None,
    total: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    token_mean: mean over every loss token in the batch (DAPO's token-level loss, long answers weigh more);
    seq_mean_token_mean: mean per sequence, then over sequences (original GRPO);
    seq_mean_token_sum_norm: per-sequence sum divided by a constant ``max_tokens`` (Dr.GRPO, no length bias).
    ``total`` replaces the local denominator (loss tokens, or sequences) with the global one when a
    mini-batch is split over data-parallel ranks, so every rank's share adds up to the global mean.
    """
    if how == "token_mean":
        denom = total if total is not None else mask.sum().clamp(min=1)
        return (per_token * mask).sum() / denom
    if how == "seq_mean_token_mean":
        has = (mask.sum(1) > 0).float()
        denom = total if total is not None else has.sum().clamp(min=1)
        return (masked_mean(per_token, mask, dim=1) * has).sum() / denom
    if how == "seq_mean_token_sum_norm":
        norm = float(max_tokens or mask.shape[1])
        denom = total if total is not None else mask.shape[0]
        return ((per_token * mask).sum(1) / norm).sum() / denom
    raise ValueError(f"unknown loss aggregation {how!r}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || ref) from samples of pi (Schulman's k1, k2, k3).

    k1 = log pi - log ref; k2 = (log pi - log ref)^2 / 2; k3 = ref/pi - 1 - log(ref/pi) (unbiased, >= 0).
    """
    log_ratio = ref_logp - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(log_ratio) - 1.0 - log_ratio
    raise ValueError(f"unknown KL estimator {kind!r}")


@dataclass
class PolicyTerms:
    """What a policy loss sees of one (rank's share of a) mini-batch: per-token tensors ``[B, T]``,
    ``advantages`` per sequence ``[B]`` or per token ``[B, T]`` (PPO with GAE), the clip range, the
    aggregation and its global denominator ``total`` (see ``aggregate``), the off-policy weight."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: Aggregation = "token_mean"
    max_tokens: int | None = None
    total: float | None = None
    is_weight: torch.Tensor | None = None

    def token_advantages(self) -> torch.Tensor:
        adv = self.advantages if self.advantages.dim() == 2 else self.advantages.unsqueeze(1)
        return adv.to(self.logp.dtype)


# A surrogate's statistics: numbers, or 0-dim tensors left on the device (the built-ins': the update reads
# them once its mini-batch has stepped, not after each micro-batch's loss)
Stats = dict[str, float | torch.Tensor]
LossFn = Callable[[PolicyTerms], tuple[torch.Tensor, Stats]]


def clipped_surrogate(x: PolicyTerms) -> tuple[torch.Tensor, Stats]:
    """PPO-clip per token: ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, ``r = pi / pi_old``
    (GRPO, Dr.GRPO, DAPO, RLOO, PPO). Returns the aggregated loss and ``clip_frac`` (share of loss tokens
    that took the clipped branch), ``ratio_mean``."""
    adv = x.token_advantages()
    ratio = torch.exp(x.logp - x.old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - x.clip_low, 1.0 + x.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if x.is_weight is not None:
        per_token = per_token * x.is_weight.detach()
    pg_loss = aggregate(per_token, x.mask, x.aggregation, x.max_tokens, x.total)
    with torch.no_grad():
        return pg_loss, {
            "clip_frac": masked_mean((clipped > unclipped).float(), x.mask),
            "ratio_mean": masked_mean(ratio, x.mask),
        }


def gspo_surrogate(x: PolicyTerms) -> tuple[torch.Tensor, Stats]:
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, ``s = exp(mean_t log(pi/pi_old))`` over
    its loss tokens, clipped at sequence level, ``max(-A s, -A clip(s))`` averaged over the sequences that
    have loss tokens (``total`` = their global count when split over ranks). Token statistics count every
    token of a clipped sequence as clipped."""
    has = x.mask.sum(1) > 0
    n = x.mask.sum(1).clamp(min=1)
    s = torch.exp(((x.logp - x.old_logp) * x.mask).sum(1) / n)
    adv = x.advantages.to(x.logp.dtype)
    unclipped = -adv * s
    clipped = -adv * torch.clamp(s, 1.0 - x.clip_low, 1.0 + x.clip_high)
    per_seq = torch.maximum(unclipped, clipped)
    if x.is_weight is not None:
        per_seq = per_seq * masked_mean(x.is_weight.detach(), x.mask, dim=1)
    denom = x.total if x.total is not None else has.sum().clamp(min=1)
    pg_loss = (per_seq * has).sum() / denom
    with torch.no_grad():
        tokens = x.mask
        return pg_loss, {
            "clip_frac": masked_mean((clipped > unclipped).float().unsqueeze(1).expand_as(tokens), tokens),
            "ratio_mean": masked_mean(s.unsqueeze(1).expand_as(tokens), tokens),
        }


def cispo_surrogate(x: PolicyTerms) -> tuple[torch.Tensor, Stats]:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight,
    ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi`` per token: no token's gradient is dropped,
    only its weight bounded. ``clip_frac`` is the share of loss tokens whose weight was clipped."""
    adv = x.token_advantages()
    ratio = torch.exp(x.logp - x.old_logp)
    weight = torch.clamp(ratio, 1.0 - x.clip_low, 1.0 + x.clip_high).detach()
    per_token = -weight * adv * x.logp
    if x.is_weight is not None:
        per_token = per_token * x.is_weight.detach()
    pg_loss = aggregate(per_token, x.mask, x.aggregation, x.max_tokens, x.total)
    with torch.no_grad():
        return pg_loss, {
            "clip_frac": masked_mean((weight != ratio).float(), x.mask),
            "ratio_mean": masked_mean(ratio, x.mask),
        }


def policy_loss(
    surrogate: LossFn,
    x: PolicyTerms,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
) -> tuple[torch.Tensor, Stats]:
    """An algorithm's surrogate plus, when ``ref_logp`` is given, the KL estimate to the reference
    (aggregated like the surrogate) weighted by ``kl_coef``. Statistics: ``pg_loss``, ``clip_frac``, ``kl``,
    ``ratio_mean`` (a surrogate reports the last two, else 0 and the mean token ratio)."""
    pg_loss, stats = surrogate(x)
    loss = pg_loss
    kl_val = torch.zeros((), dtype=x.logp.dtype, device=x.logp.device)
    if ref_logp is not None:
        kl_tok = kl_estimate(x.logp, ref_logp, kl_kind)
        kl_val = aggregate(kl_tok, x.mask, x.aggregation, x.max_tokens, x.total)
        if kl_coef:
            loss = loss + kl_coef * kl_val
    out: Stats = {"pg_loss": pg_loss.detach(), "kl": kl_val.detach(), "clip_frac": 0.0, **stats}
    if "ratio_mean" not in out:  # a surrogate that does not report it
        with torch.no_grad():
            out["ratio_mean"] = masked_mean(torch.exp(x.logp - x.old_logp), x.mask)
    return loss, out


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
    **terms: Any,
) -> tuple[torch.Tensor, Stats]:
    """PPO-clip surrogate with per-sequence advantages broadcast over tokens, plus optional KL (``terms``:
    the other ``PolicyTerms`` fields). ``is_weight`` (per token, no gradient) multiplies each token's
    surrogate: the off-policy correction between the anchor and the behaviour policy.

    >>> lp = torch.zeros(1, 2); m = torch.ones(1, 2)
    >>> clipped_pg_loss(lp, lp, torch.ones(1), m, is_weight=torch.tensor([[2.0, 0.0]]))[0].item()
    -1.0
    """
    x = PolicyTerms(logp, old_logp, advantages, mask, **terms)
    return policy_loss(clipped_surrogate, x, ref_logp, kl_coef, kl_kind)


def importance_weights(
    anchor_logp: torch.Tensor, behaviour_logp: torch.Tensor, kind: Literal["tis", "mis"], cap: float
) -> torch.Tensor:
    """Per-token weights correcting for sampling from the behaviour policy (the rollout engine's logprobs)
    instead of the anchor: ``w = pi_anchor / pi_behaviour``; tis truncates it at ``cap``, mis keeps 1 where
    ``1/cap <= w <= cap`` and 0 elsewhere (the token drops out of the loss).

    >>> a = torch.log(torch.tensor([[0.5, 0.5, 0.1]])); b = torch.log(torch.tensor([[0.5, 0.1, 0.5]]))
    >>> importance_weights(a, b, "tis", 2.0), importance_weights(a, b, "mis", 2.0)
    (tensor([[1.0000, 2.0000, 0.2000]]), tensor([[1., 0., 0.]]))
    """
    w = torch.exp(anchor_logp - behaviour_logp)
    if kind == "tis":
        return w.clamp(max=cap)
    if kind == "mis":
        return ((w <= cap) & (w >= 1.0 / cap)).to(w.dtype)
    raise ValueError(f"unknown off-policy correction {kind!r}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) per position from ``logits`` ``[B, T, V]`` aligned with ``targets`` ``[B, T]``: the
    reference definition (the trainer takes it fused with the entropy: ``rl_core.training.logprobs.
    logits_stats``, bit for bit this, ``tests/unit/test_logits_stats.py``)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The policy's entropy per position: the reference definition ``logits_stats`` fuses (as above)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)
