"""PPO's critic: a value model (the policy's architecture with a scalar head), GAE, and its own update.

The critic is an output of each train stage (``critic.safetensors``: its weights and its AdamW state in one
file that cannot carry code, ``rl_core.artifacts.safe_state``) and an input of the next, so a resumed run or a
replayed train stage continues from stored bytes alone and reproduces them bit for bit. At iteration 1 it
starts from the input policy (the warmed-up base model) with a zero head. With data-parallel ranks every rank
makes the same critic update on the whole batch (no communication; the critic is small next to the policy).

    metrics, state = critic_step(ctx, job, batch, seq_reward, kl_tokens)   # sets batch.advantages per token

The reward of a completion sits on its last model token; ``train.kl_in: reward`` adds ``-kl_coef x`` each
token's KL estimate. Observation tokens of a multi-turn episode are skipped (GAE runs over the model's own
tokens in order).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rl_core.artifacts import safe_state
from rl_core.artifacts.seeding import derive_seed
from rl_core.models.model import load_model
from rl_core.training.train_engine import without_dropout


class ValueModel(torch.nn.Module):
    """``V(s_t)`` for each target position ``t`` (aligned with the loss mask): the policy's body and a
    linear head from the last hidden state, initialised to zero (no random draw)."""

    def __init__(self, lm: Any):
        super().__init__()
        self.body = lm.base_model
        self.head_w = torch.nn.Parameter(torch.zeros(lm.config.hidden_size))
        self.head_b = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = self.body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        return (h.float() @ self.head_w + self.head_b)[:, :-1]


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's masked positions (the model's tokens, in order):
    ``delta_t = r_t + gamma V_next - V_t``, ``A_t = delta_t + gamma lam A_next``, ``V`` after the last = 0.
    Returns (advantages, returns = A + V), zero off the mask.

    >>> r = torch.tensor([[0.0, 0.0, 1.0]]); v = torch.tensor([[0.5, 0.5, 0.5]]); m = torch.ones(1, 3)
    >>> [round(x, 4) for x in gae(r, v, m, 1.0, 0.5)[0][0].tolist()]
    [0.125, 0.25, 0.5]
    """
    adv = torch.zeros_like(values, dtype=torch.float64)
    for i in range(values.shape[0]):
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(torch.nonzero(mask[i]).flatten().tolist()):
            v = float(values[i, t])
            delta = float(rewards[i, t]) + gamma * nxt_v - v
            nxt_a = delta + gamma * lam * nxt_a
            adv[i, t], nxt_v = nxt_a, v
    adv = adv.to(values.dtype)
    return adv, (adv + values) * mask


def terminal_rewards(seq_reward: np.ndarray, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's reward on its last masked token (0 where no reward was given: NaN).

    >>> terminal_rewards(np.array([2.0, np.nan]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    tensor([[0., 2., 0.],
            [0., 0., 0.]])
    """
    out = torch.zeros_like(mask)
    for i, r in enumerate(np.nan_to_num(seq_reward, nan=0.0).tolist()):
        idx = torch.nonzero(mask[i]).flatten()
        if len(idx):
            out[i, idx[-1]] = r
    return out


def value_loss(
    values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """``0.5 (V - R)^2``, with ``clip > 0`` the larger of that and the clipped update's
    ``0.5 (old + clip(V - old, -clip, clip) - R)^2``; mean over masked tokens.

    >>> v, o, r, m = torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.tensor([[3.0]]), torch.ones(1, 1)
    >>> value_loss(v, o, r, m, 0.0).item(), value_loss(v, o, r, m, 0.5).item()  # clipped: V = 0.5
    (0.5, 3.125)
    """
    err = (values - returns) ** 2
    if clip > 0:
        clipped = old + torch.clamp(values - old, -clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return 0.5 * (err * mask).sum() / mask.sum().clamp(min=1)


def _load(ctx: Any, job: Any) -> tuple[ValueModel, torch.optim.Optimizer]:
    cfg = ctx.cfg.train
    model = ValueModel(without_dropout(load_model(ctx.local_checkpoint(job.inputs["policy"]))))
    model.to(ctx.placement.workloads["critic"].device)  # a no-op on the CPU
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.critic_lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8
    )
    if "critic" in job.inputs:
        uri = job.inputs["critic"].uri
        state = safe_state.loads(ctx.store.read_bytes(job.inputs["critic"]), uri)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    return model, opt


@torch.no_grad()
def _values(model: ValueModel, batch: Any, chunk: int) -> torch.Tensor:
    dev = next(model.parameters()).device
    out = [
        model(batch.input_ids[i : i + chunk].to(dev), batch.attention_mask[i : i + chunk].to(dev)).cpu()
        for i in range(0, len(batch), chunk)
    ]
    return torch.cat(out) * batch.loss_mask


def _fit(
    model: ValueModel,
    opt: Any,
    batch: Any,
    fitted: torch.Tensor,
    targets: tuple[torch.Tensor, torch.Tensor],
    cfg: Any,
    seed: int,
) -> list[float]:
    """``cfg.epochs`` passes of mini-batches of ``cfg.micro_batch_size`` sequences, one AdamW step each, on
    the tokens of ``fitted`` (a mask), toward ``targets``: (the values before, the returns)."""
    old, returns = targets
    model.train()
    dev = next(model.parameters()).device
    losses = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(batch), generator=gen)
        for start in range(0, len(batch), cfg.micro_batch_size):
            mb = order[start : start + cfg.micro_batch_size]
            mask = fitted[mb]
            if mask.sum() == 0:
                continue
            v = model(batch.input_ids[mb].to(dev), batch.attention_mask[mb].to(dev))
            loss = value_loss(v, old[mb].to(dev), returns[mb].to(dev), mask.to(dev), cfg.value_clip)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
    return losses


def ppo_targets(
    seq_reward: np.ndarray, values: torch.Tensor, mask: torch.Tensor, kl_tokens: torch.Tensor | None, cfg: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token GAE advantages, the critic's returns, and the tokens the critic is fitted on. A completion
    given no reward (NaN: an infra failure, every judge abstaining) gets advantage 0 and is no target of the
    critic, as GRPO's advantages leave it: never trained as if it had earned 0 (it was, through
    ``terminal_rewards``' 0).

    >>> cfg = type("C", (), {"kl_coef": 0.0, "gamma": 1.0, "lam": 1.0})
    >>> values, mask = torch.full((2, 2), 0.5), torch.ones(2, 2)
    >>> adv, ret, fit = ppo_targets(np.array([1.0, np.nan]), values, mask, None, cfg)
    >>> adv.tolist(), fit.tolist()
    ([[0.5, 0.5], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]])
    """
    rewards = terminal_rewards(seq_reward, mask)
    if kl_tokens is not None:
        rewards = rewards - cfg.kl_coef * kl_tokens * mask
    adv, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
    unscored = torch.from_numpy(np.isnan(np.asarray(seq_reward, dtype=np.float64)))
    adv[unscored] = 0.0
    return adv, returns, mask * (~unscored).to(mask.dtype)[:, None]


def critic_step(
    ctx: Any, job: Any, batch: Any, seq_reward: np.ndarray, kl_tokens: torch.Tensor | None
) -> tuple[dict[str, float], bytes]:
    """Values of the batch under the input critic, per-token GAE advantages into ``batch.advantages``, then
    the critic's update toward the returns; its metrics and new state (``critic.safetensors``'s bytes)."""
    cfg = ctx.cfg.train
    model, opt = _load(ctx, job)
    model.eval()
    values = _values(model, batch, cfg.micro_batch_size)
    adv, returns, fitted = ppo_targets(seq_reward, values, batch.loss_mask, kl_tokens, cfg)
    batch.advantages = adv
    seed = derive_seed(ctx.cfg.experiment.seed, job.iteration, "critic")
    losses = _fit(model, opt, batch, fitted, (values, returns), cfg, seed)
    state = safe_state.dumps({"model": model.state_dict(), "optimizer": opt.state_dict()})
    n = batch.loss_mask.sum().clamp(min=1)
    metrics = {
        "value_loss": float(np.mean(losses)) if losses else 0.0,
        "value_mean": float(values.sum() / n),
        "return_mean": float(returns.sum() / n),
        "advantage_mean": float(adv.sum() / n),
    }
    return metrics, state
