"""The trainer's log-probabilities of the taken tokens (and the policy's entropy) from one forward, without
the whole vocabulary's float32 logits at once where they would not fit ``train.logits_chunk_mb``.

A forward of ``B x T`` tokens on a 151,936-entry vocabulary holds ``B * T * 151,936 * 4`` bytes of float32
logits, and autograd keeps their log-softmax for the backward: at 32k tokens, 19 GiB, more than the rest of
a 0.5B model's update. Here the causal LM's last hidden states are computed once and the head runs on chunks
of ``chunk`` positions: each chunk's logits exist only while its logprobs (and entropies) are taken, and under
autograd the chunk is checkpointed (its logits recomputed in the backward from the hidden states it kept), so
the peak is one chunk's logits. The values are the unchunked path's (the same matmul per row, the same
log-softmax; ``tests/unit/test_chunked_logprobs.py``: 1e-6 in fp32, gradients too).

    logp, entropy = token_stats(module, ids, attn, temperature=1.0, chunk=4096, entropy=True)

Only models whose logits are ``lm_head(model(...).last_hidden_state)`` and nothing else are chunked (text
causal LMs: Qwen2/2.5/3, Llama, Mistral); a vision-language model or logits with a soft cap or scale keep the
whole-logits path (``head_parts`` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rl_core.models.vision import NEVER, unsampleable_ids

# configs that change the logits after the head: such a model keeps the whole-logits path
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_parts(module: Any) -> tuple[Any, Any] | None:
    """(the model below the head, the head) of a text causal LM whose logits are exactly
    ``head(base(...).last_hidden_state)``; None for any other (its logits are taken whole)."""
    cfg = getattr(module, "config", None)
    base, head = getattr(module, "model", None), getattr(module, "lm_head", None)
    if cfg is None or base is None or head is None or getattr(cfg, "vision_config", None) is not None:
        return None
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in _LOGIT_TRANSFORMS):
        return None
    return base, head


def chunk_positions(module: Any, budget_mb: float) -> int:
    """Positions per head chunk so that one chunk's float32 logits (and their log-softmax and softmax: three
    vocabulary-wide rows a position) stay within ``budget_mb`` MiB; 0 (no chunking) when the model cannot
    be chunked or ``budget_mb`` is 0."""
    vocab = getattr(getattr(module, "config", None), "vocab_size", None)
    if not budget_mb or not vocab or head_parts(module) is None:
        return 0
    return max(1, int(budget_mb * 2**20 // (3 * 4 * vocab)))


def logits_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    never: list[int] | None = None,
    entropy: bool = False,
    own: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) per position from ``logits`` ``[..., V]`` aligned with ``targets`` ``[...]`` after the
    ``never`` columns are set to ``NEVER`` and the temperature applied (and the entropies, without grad, when
    asked), from one float32 log-softmax: bit for bit what ``suppress``, ``token_logprobs`` and
    ``entropy_from_logits`` give, with fewer vocabulary-wide tensors (no division at temperature 1, one
    log-softmax for both, the entropy's product in place). ``own``: nothing else reads ``logits`` and its
    maker does not keep it for a backward (a ``Linear``'s output, or any tensor without grad), so the
    suppression and the temperature are written into it.

    >>> lp, ent = logits_stats(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([0]), never=[2], entropy=True)
    >>> round(float(lp[0]), 4), round(float(ent[0]), 4)
    (-0.6931, 0.6931)
    """
    if never:
        idx = torch.tensor(never, device=logits.device)
        logits = logits.index_fill_(-1, idx, NEVER) if own else logits.index_fill(-1, idx, NEVER)
        own = True
    x = logits.float()
    own = own or x is not logits
    if temperature != 1.0:  # x / 1.0 is x, bit for bit: no copy for it
        x = x.div_(temperature) if own else x / temperature
    logp = torch.log_softmax(x, dim=-1)
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return lp, None
    with torch.no_grad():
        return lp, -logp.exp().mul_(logp).sum(-1)


def _chunk(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, never: list[int], ent: list
) -> tuple[torch.Tensor, torch.Tensor]:
    # the head's output is this chunk's own, and a Linear keeps its input, not its output, for the backward
    lp, e = logits_stats(head(hidden), targets, temperature, never, ent[0], own=True)
    # ``ent`` ([take the entropies]) is cleared after the first run: the backward's recompute of a
    # checkpointed chunk needs only the logprobs (the entropies, without grad, are kept from the forward)
    ent[0] = False
    return lp, e if e is not None else lp.new_zeros(lp.shape)


def chunked_stats(
    head: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    never: list[int] | None = None,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position logprobs of ``targets`` ``[B, T]`` (and entropies, without grad) from the last hidden
    states ``[B, T, H]`` through ``head``, ``chunk`` positions at a time; checkpointed under autograd."""
    b, t = targets.shape
    flat_h, flat_t = hidden.reshape(b * t, -1), targets.reshape(b * t)
    lps, ents = [], []
    grad = torch.is_grad_enabled() and hidden.requires_grad
    for i in range(0, b * t, chunk):
        args = (head, flat_h[i : i + chunk], flat_t[i : i + chunk], temperature, never or [], [entropy])
        lp, e = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        lps.append(lp)
        ents.append(e)
    return torch.cat(lps).view(b, t), (torch.cat(ents).view(b, t) if entropy else None)


def token_stats(
    module: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    temperature: float,
    chunk: int,
    entropy: bool = False,
    forward: Callable[..., torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T-1]`` logprobs of ``ids[:, 1:]`` under ``module`` (and entropies when asked) on a padded batch,
    the head in chunks of ``chunk`` positions. ``forward(base, ids, attn)`` gives the last hidden states
    ``[B, T-1, H]`` aligned with the targets (default: the padded forward; packing passes its own)."""
    base, head = head_parts(module)  # type: ignore[misc]
    if forward is None:
        hidden = base(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]
    else:
        hidden = forward(base, ids, attn)
    return chunked_stats(head, hidden, ids[:, 1:], temperature, chunk, unsampleable_ids(module), entropy)
