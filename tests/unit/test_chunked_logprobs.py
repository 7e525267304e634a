"""The head in chunks (rl_core/training/logprobs.py, train.logits_chunk_mb): the taken tokens' logprobs,
entropies and gradients equal the whole-logits path's (fp32, padded and packed), a PPO update through it
ends on the same weights, and autograd keeps no vocabulary-wide tensor larger than one chunk."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rl_core.schema.config import load_config
from rl_core.training import ppo
from rl_core.training.logprobs import chunk_positions, head_parts
from rl_core.training.ppo import _stats, make_batch, ppo_update, sequence_logprobs
from rl_core.training.train_engine import TorchTrainEngine, make_train_engine
from tests.unit.test_micro_batches import world_of_one  # noqa: F401  (autouse: DeepSpeed's world of one)
from tests.unit.test_packing import _frame, _policy

TOL = 1e-6
TINY_MB = 1e-4  # under one position's logits of the test policy's vocabulary: a chunk of one position


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pack_tokens", [None, 16])
@pytest.mark.parametrize("mb", [TINY_MB, 0.002])
def test_chunked_logprobs_entropy_and_gradients_equal_the_whole_logits(pack_tokens, mb):
    got = []
    for logits_mb in (0.0, mb):
        model = _policy().train()
        b = make_batch(_frame(), pad_id=1, temperature=0.7, pack_tokens=pack_tokens, logits_mb=logits_mb)
        rows = torch.arange(len(b))
        lp, ent = _stats(model, b, rows, None, entropy=True)
        weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)  # any per-token weights of a loss
        (lp * weights * b.loss_mask).sum().backward()
        got.append((lp.detach(), ent, _grads(model)))
    (lp0, ent0, g0), (lp1, ent1, g1) = got
    real = b.attention_mask[:, 1:].bool()
    assert torch.allclose(lp0[real], lp1[real], atol=TOL) and torch.allclose(ent0[real], ent1[real], atol=TOL)
    assert set(g0) == set(g1) and any(g.abs().sum() > 0 for g in g0.values())
    for name, g in g0.items():
        assert torch.allclose(g1[name], g, atol=TOL), name


def test_autograd_keeps_no_vocabulary_wide_tensor_past_a_chunk():
    """What the backward holds: the whole path saves the ``[B, T, V]`` log-softmax; the chunked one nothing
    vocabulary-wide (each chunk's logits are recomputed in the backward)."""
    model = _policy().train()
    vocab = model.config.vocab_size
    widest = {}
    for logits_mb in (0.0, 0.002):
        b = make_batch(_frame(), pad_id=1, logits_mb=logits_mb)
        chunk = chunk_positions(model, logits_mb)
        saved: list[int] = []

        def pack(t: torch.Tensor, saved: list[int] = saved) -> torch.Tensor:
            if t.dim() and t.shape[-1] == vocab:
                saved.append(t.numel() // vocab)  # positions of vocabulary-wide rows kept for the backward
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, _ = _stats(model, b, torch.arange(len(b)), None, entropy=False)
        lp.sum().backward()
        widest[logits_mb] = (max(saved, default=0), chunk)
    positions = b.input_ids.shape[0] * (b.input_ids.shape[1] - 1)
    assert widest[0.0][0] >= positions  # the whole path: every position's row at once
    saved_rows, chunk = widest[0.002]
    assert 0 < chunk < positions and saved_rows <= chunk  # the head's weight [V, H] is V rows of H, not kept


def test_the_backwards_recompute_takes_no_entropy_again(monkeypatch: pytest.MonkeyPatch):
    """Entropies are taken once per chunk, in the forward: the backward's recompute of a checkpointed chunk
    asks for the logprobs only (the default ``old_logprobs: engine`` takes the first epoch's entropies from
    these forwards)."""
    from rl_core.training import logprobs

    model = _policy().train()
    b = make_batch(_frame(), pad_id=1, logits_mb=TINY_MB)
    asked: list[bool] = []
    real = logprobs.logits_stats

    def spy(*a, **k):
        asked.append(a[4])  # entropy
        return real(*a, **k)

    monkeypatch.setattr(logprobs, "logits_stats", spy)
    lp, ent = _stats(model, b, torch.arange(len(b)), None, entropy=True)
    chunks = len(asked)
    assert chunks == lp.numel() and all(asked)  # TINY_MB: a chunk a position, each with its entropy
    lp.sum().backward()
    assert len(asked) == 2 * chunks and not any(asked[chunks:])  # each recomputed, without its entropy
    assert ent is not None and torch.isfinite(ent).all()


def test_a_ppo_update_through_chunks_ends_on_the_same_weights(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = ppo.token_stats
    monkeypatch.setattr(ppo, "token_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    sets = ["train.micro_batch_size=3", "train.epochs=2", "train.old_logprobs=recompute"]
    cfg = load_config("configs/smoke.yaml", sets).train
    runs = []
    for logits_mb in (0.0, TINY_MB):
        engine = TorchTrainEngine(_policy(), cfg)
        b = make_batch(_frame(), pad_id=1, seed=5, logits_mb=logits_mb)
        lp, ent = sequence_logprobs(engine.module, b, chunk=4)
        metrics = ppo_update(engine, b, cfg)
        runs.append((metrics, lp * b.loss_mask, ent * b.loss_mask, engine.module.state_dict()))
    assert calls  # the second run went through the chunks
    (m0, lp0, ent0, w0), (m1, lp1, ent1, w1) = runs
    assert torch.allclose(lp0, lp1, atol=TOL) and torch.allclose(ent0, ent1, atol=TOL)
    assert len(m0["losses"]) == 4 and np.allclose(m0["losses"], m1["losses"], atol=TOL)
    assert m0["entropy"] == pytest.approx(m1["entropy"], abs=TOL)
    assert max(float((w0[k] - w1[k]).abs().max()) for k in w0) < TOL
    assert max(float((w0[k] - _policy().state_dict()[k]).abs().max()) for k in w0) > 1e-4  # it moved


def test_which_models_are_chunked_and_by_how_much():
    model = _policy()
    assert head_parts(model) is not None
    # 512 MiB over three float32 rows of Qwen's vocabulary a position
    qwen = SimpleNamespace(config=SimpleNamespace(vocab_size=151_936), model=object(), lm_head=object())
    assert chunk_positions(qwen, 512) == 294
    assert chunk_positions(qwen, 0) == 0  # 0: always whole
    capped = SimpleNamespace(
        config=SimpleNamespace(vocab_size=9, final_logit_softcapping=30.0), model=1, lm_head=1
    )
    vlm = SimpleNamespace(config=SimpleNamespace(vocab_size=9, vision_config={}), model=1, lm_head=1)
    assert head_parts(capped) is None and head_parts(vlm) is None
    assert chunk_positions(vlm, 512) == 0
    assert load_config("configs/smoke.yaml", []).train.logits_chunk_mb == 512


@pytest.mark.parametrize("zero", [0, 3])
def test_deepspeed_through_chunks_ends_on_the_same_weights(zero):
    """DeepSpeed at one rank: ZeRO-3 gathers the head's weight in each chunk's forward and again in its
    recompute in the backward; the update is the whole path's."""
    from tests.unit.test_micro_batches import _batch, _model

    tc = load_config("configs/smoke.yaml", ["train.micro_batch_size=64", f"train.zero_stage={zero}"]).train
    weights = []
    for logits_mb in (0.0, 0.001):
        engine = make_train_engine("deepspeed", _model(), tc)
        try:
            b = _batch()
            b.logits_mb = logits_mb
            out = ppo_update(engine, b, tc)
            weights.append((out, engine.weights()))
        finally:
            engine.close()
    (m0, w0), (m1, w1) = weights
    assert 0 < chunk_positions(_model(), 0.001) < b.input_ids.numel()  # chunked
    assert m0["loss"] == pytest.approx(m1["loss"], rel=1e-6, abs=1e-8)
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=TOL, rtol=0)
