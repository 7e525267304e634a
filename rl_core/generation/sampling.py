"""The HF engine's sampling step: one token per row of a batch's last logits, each row from its own
seeded generator (``rl_core.generation.rollout.HFEngine``)."""

from __future__ import annotations

import math
from typing import Any


def sample_tokens(logits: Any, gens: list[Any], temperature: float) -> tuple[Any, Any]:
    """One token per row of ``logits`` (rows x vocab, float32, on any device) and its logprob, as two tensors
    on that device: greedy at temperature 0, else drawn from the row's own generator (``gens[i]``, on the
    logits' device; one draw per row and step, whether the row is still running or not, so a request's samples
    never depend on the others). Nothing of the vocabulary leaves the device: on a GPU only the chosen tokens
    and their logprobs are copied back, by the caller.

    The draw is ``torch.multinomial(probs, 1, generator=g)`` bit for bit, done as torch does it for one
    sample: the argmax of ``probs / q`` with ``q`` ~ Exp(1) drawn from the row's generator (the exponential
    race). Only the draws of ``q`` go row by row; the softmax, the race and the logprobs run over the whole
    batch at once (``tests/unit/test_hf_sampling.py`` checks tokens, logprob bits and generator states
    against the row-by-row multinomial loop).

    Nothing here waits for the device: a row with NaN (or infinite) logits gets a NaN logprob, which the
    caller refuses once the values are on the host (``refuse_nan``), where torch.multinomial would have
    refused the step."""
    import torch

    if temperature == 0:
        toks = logits.argmax(-1)
        return toks, torch.log_softmax(logits, -1).gather(1, toks[:, None])[:, 0]
    logp = torch.log_softmax(logits / temperature, -1)
    race = torch.empty_like(logp)
    for row, g in zip(race, gens, strict=True):
        row.exponential_(1, generator=g)
    picked = (logp.exp() / race).argmax(-1)
    return picked, logp.gather(1, picked[:, None])[:, 0]


def refuse_nan(logprobs: list[list[float]]) -> None:
    """Raise naming the rows (of ``logprobs``: rows x steps, on the host) whose model gave NaN logits: the
    sampled logprob is NaN exactly there. A broken model is named, never sampled from."""
    rows = [i for i, row in enumerate(logprobs) if any(math.isnan(x) for x in row)]
    if rows:
        steps = [t for t, x in enumerate(logprobs[rows[0]]) if math.isnan(x)]
        raise ValueError(
            f"HF engine: the model's logits are NaN in rows {rows[:8]} of the batch"
            f" (row {rows[0]} from step {steps[0]})"
        )


def sample_step(logits: Any, gens: list[Any], temperature: float) -> tuple[list[int], list[float]]:
    """``sample_tokens`` as Python lists (tokens, logprobs); a NaN row is refused (``refuse_nan``)."""
    toks, lps = sample_tokens(logits, gens, temperature)
    values = lps.tolist()
    refuse_nan([[x] for x in values])
    return toks.tolist(), values


def completion_text(tokenizer: Any, ids: list[int], stop: Any) -> str:
    """A completion's text, one rule for every engine: its tokens decoded by the folder's tokenizer, special
    tokens kept (a Qwen3 folder's ``<think>``/``</think>`` are special: vLLM's own text dropped them, so
    ``<think>h</think>7`` reached the verifier as ``h7`` from vLLM and as the whole from the HF engine), the
    stop token that ended it (in ``stop``) left out."""
    stopped = bool(ids) and ids[-1] in stop
    return str(tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False))
