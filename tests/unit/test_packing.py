"""Sequence packing (train.packing): the plan worked by hand, the block-diagonal causal mask transformers
derives from the restarted positions, and a real tiny Qwen2 policy whose packed logits, PPO losses and
gradients equal the padded ones within fp32 tolerance, multi-turn observation tokens masked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rl_core.models.model import build_model, build_tokenizer
from rl_core.schema.config import ConfigError, load_config
from rl_core.training.losses import clipped_pg_loss, token_logprobs
from rl_core.training.packing import (
    PackPlan,
    block_causal_mask,
    pack,
    pack_budget,
    pack_plan,
    packed_logits,
    padding_fraction,
    position_ids,
)
from rl_core.training.ppo import _logits, make_batch, ppo_update, sequence_logprobs
from rl_core.training.train_engine import TorchTrainEngine

# fp32 on CPU: packed rows change the shapes of the matmuls, so sums run in another order (measured max
# |diff| ~1e-6 on logits of magnitude ~1, ~1e-8 on gradients)
ATOL = 1e-5


def test_first_fit_decreasing_by_hand():
    # longest first: 5 -> row 0 (room 2), 4 -> row 1 (room 3), 3 -> row 1 (room 0), 2 -> row 0, 1 -> new row
    plan = pack_plan([2, 5, 3, 4, 1], budget=7)
    assert plan.rows == [[1, 0], [3, 2], [4]]
    assert plan.width == 7
    assert plan.offsets() == [(0, 5), (0, 0), (1, 4), (1, 0), (2, 0)]
    # ties keep batch order; a sequence over the budget gets a row of its own, as wide as it is
    assert pack_plan([3, 3, 3], budget=6).rows == [[0, 1], [2]]
    over = pack_plan([9, 2, 2], budget=4)
    assert over.rows == [[0], [1, 2]] and over.width == 9
    with pytest.raises(ValueError, match="budget"):
        pack_plan([1], budget=0)


def test_positions_restart_and_padding_is_its_own_segment():
    plan = PackPlan([[1, 0], [3, 2], [4]], [2, 5, 3, 4, 1], 7)
    assert position_ids(plan).tolist() == [
        [0, 1, 2, 3, 4, 0, 1],
        [0, 1, 2, 3, 0, 1, 2],
        [0, 0, 1, 2, 3, 4, 5],  # one token, then six of padding
    ]


def test_pack_trims_right_padding_and_places_the_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 0], [4, 0, 0, 0]])
    attn = (ids > 0).long()
    packed, pos, plan = pack(ids, attn, budget=4)
    assert plan.rows == [[1, 2], [0]]
    assert packed.tolist() == [[7, 8, 9, 4], [5, 6, 0, 0]]
    assert pos.tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert pack(ids, attn, budget=0)[2].rows == [[1], [0, 2]]  # 0: the longest (3) is the budget
    with pytest.raises(ValueError, match="right-padded"):
        pack(ids, torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]), budget=4)


def test_block_mask_by_hand_is_what_transformers_builds():
    from transformers import Qwen2Config
    from transformers.masking_utils import create_causal_mask

    pos = torch.tensor([[0, 1, 0, 1, 2, 0]])
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert block_causal_mask(pos).int().tolist() == [expected]
    cfg = Qwen2Config(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    for impl in ("sdpa", "eager"):
        cfg._attn_implementation = impl
        mask = create_causal_mask(cfg, torch.zeros(1, 6, 16), None, None, position_ids=pos)[:, 0]
        allowed = mask if mask.dtype == torch.bool else mask == 0  # eager: additive 0 / -inf
        assert allowed.int().tolist() == [expected], impl


def test_padding_fraction():
    assert padding_fraction([2, 5, 3, 4, 1], rows=5, width=5) == pytest.approx(1 - 15 / 25)
    assert padding_fraction([2, 5, 3, 4, 1], rows=3, width=7) == pytest.approx(1 - 15 / 21)


def _policy(attn: str = "sdpa"):
    tok = build_tokenizer(["calc(12*34)=408 ans(413) 0123456789+-"], vocab_size=48)
    cfg = load_config("configs/smoke.yaml", []).model
    model = build_model(cfg, tok, seed=0)
    model.set_attn_implementation(attn)
    return model


# prompt ids, completion ids, and which completion tokens are the model's (0 = environment observation)
ROWS = [
    ([3, 4, 5], [10, 11, 20, 21, 22, 12, 13], [1, 1, 0, 0, 0, 1, 1]),  # two turns, observation masked
    ([6, 7], [14], [1]),
    ([8, 9, 10, 11, 12], [15, 16, 17], [1, 1, 1]),
    ([3], [18, 19, 23, 24, 25, 26, 27, 28, 29, 30, 31], [1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1]),  # three turns
    ([4, 4], [12, 13, 14, 15], [1, 1, 1, 1]),
    ([5, 6, 7, 8], [9, 30], [1, 0]),
]


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "prompt_ids": [p for p, _, _ in ROWS],
            "completion_ids": [c for _, c, _ in ROWS],
            "logprobs": [list(rng.uniform(-3.0, -0.5, len(c))) for _, c, _ in ROWS],
            "loss_mask": [m for _, _, m in ROWS],
            "advantage": rng.normal(size=len(ROWS)),
        }
    )


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("budget", [0, 9, 24])
def test_packed_logits_equal_padded_on_every_real_token(attn, budget):
    model = _policy(attn).eval()
    b = make_batch(_frame(), pad_id=1)
    with torch.no_grad():
        padded = _logits(model, b.input_ids, b.attention_mask)
        packed = packed_logits(model, b.input_ids, b.attention_mask, budget)
    real = b.attention_mask[:, 1:].bool()  # targets that exist
    assert packed.shape == padded.shape
    assert torch.allclose(packed[real], padded[real], atol=ATOL)
    assert not packed[~real].any()  # nothing past a sequence's end


def test_packed_logits_on_flex_attention_equal_padded_on_sdpa():
    """``train.attn`` auto's kernel for packed rows on a GPU without flash-attn: flex_attention, the document
    mask as a block mask made from the positions, never dense. Its forward, compiled here on the CPU, gives
    the padded rows' logits on sdpa (its backward has no CPU kernel: the placement refuses it on a CPU)."""
    b = make_batch(_frame(), pad_id=1)
    with torch.no_grad():
        padded = _logits(_policy("sdpa").eval(), b.input_ids, b.attention_mask)
        packed = packed_logits(_policy("flex_attention").eval(), b.input_ids, b.attention_mask, 24)
    real = b.attention_mask[:, 1:].bool()
    assert torch.allclose(packed[real], padded[real], atol=ATOL)
    assert not packed[~real].any()


def test_packed_loss_and_gradients_equal_padded():
    losses, grads = [], []
    for pack_tokens in (None, 16):
        model = _policy().train()
        b = make_batch(_frame(), pad_id=1, pack_tokens=pack_tokens)
        logits = _logits(model, b.input_ids, b.attention_mask, None, b.pack_tokens)
        logp = token_logprobs(logits, b.input_ids[:, 1:])
        loss, _ = clipped_pg_loss(logp, b.rollout_logp, b.advantages, b.loss_mask, clip_high=0.28)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], abs=ATOL)
    assert abs(losses[0]) > 1e-3  # a loss that could differ
    for name, g in grads[0].items():
        assert g.abs().sum() > 0 or "embed" in name
        assert torch.allclose(grads[1][name], g, atol=1e-6), name


def test_ppo_update_and_recompute_match_padded():
    cfg = load_config("configs/smoke.yaml", ["train.micro_batch_size=3", "train.epochs=2"]).train
    runs = []
    for pack_tokens in (None, 0):
        engine = TorchTrainEngine(_policy(), cfg)
        b = make_batch(_frame(), pad_id=1, seed=5, pack_tokens=pack_tokens)
        lp, ent = sequence_logprobs(engine.module, b, chunk=4)
        runs.append((ppo_update(engine, b, cfg), lp * b.loss_mask, ent * b.loss_mask))
    (padded, lp0, ent0), (packed, lp1, ent1) = runs
    assert torch.allclose(lp0, lp1, atol=ATOL) and torch.allclose(ent0, ent1, atol=ATOL)
    assert len(padded["losses"]) == len(packed["losses"]) == 4  # 2 epochs of 2 mini-batches
    assert np.allclose(padded["losses"], packed["losses"], atol=ATOL)
    assert padded["entropy"] == pytest.approx(packed["entropy"], abs=ATOL)


def test_vision_batches_are_refused():
    model = _policy()
    ids, attn = torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="train.packing=false"):
        packed_logits(model, ids, attn, 0, pixels=torch.zeros(2, 3, 8, 8))
    df = _frame().assign(image=[b"x"] * len(ROWS))
    with pytest.raises(ValueError, match="train.packing=false"):
        make_batch(df, pad_id=1, ckpt_dir="/nonexistent", pack_tokens=0)


def test_config_fields():
    cfg = load_config("configs/smoke.yaml", [])
    assert cfg.train.packing is False and pack_budget(cfg.train) is None  # default: padded, as before
    on = load_config("configs/smoke.yaml", ["train.packing=true", "train.pack_tokens=128"])
    assert pack_budget(on.train) == 128
    assert pack_budget(load_config("configs/smoke.yaml", ["train.packing=true"]).train) == 0
    with pytest.raises(ConfigError, match="train.packing=true"):
        load_config("configs/smoke.yaml", ["train.pack_tokens=64"])
    with pytest.raises(ConfigError, match="pack_tokens"):
        load_config("configs/smoke.yaml", ["train.packing=true", "train.pack_tokens=-1"])
