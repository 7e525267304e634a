"""The PPO anchor (train.old_logprobs) and the off-policy corrections, on a tiny torch model: the engine
anchor costs no extra forward pass, recompute does; tis/mis weigh tokens by anchor / behaviour."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rl_core.schema.config import ConfigError, load_config
from rl_core.training.ppo import make_batch, ppo_update


class Counting(torch.nn.Module):
    """A bigram model that counts its forward passes."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, vocab)
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        self.calls += 1
        return type("Out", (), {"logits": self.emb(input_ids)})()


class Engine:
    world_size, rank, device = 1, 0, None

    def __init__(self):
        self.module = Counting()
        self.opt = torch.optim.SGD(self.module.parameters(), lr=0.1)

    def backward_step(self, loss, step=True):
        assert step  # no forward budget set: one forward per mini-batch
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return 0.0


PROMPTS = [[1, 2], [3, 4], [5, 6], [7, 8]]
COMPLETIONS = [[3, 4], [5], [6, 7], [2]]


def _batch(behaviour_logp: float | None, model: Counting | None = None):
    """Behaviour logprobs all ``behaviour_logp``, or (None) exactly the bigram ``model``'s own."""
    logprobs = []
    for p, c in zip(PROMPTS, COMPLETIONS, strict=True):
        seq = p + c
        if behaviour_logp is None:
            with torch.no_grad():
                table = torch.log_softmax(model.emb.weight, -1)
            logprobs.append([table[seq[len(p) + j - 1], t].item() for j, t in enumerate(c)])
        else:
            logprobs.append([behaviour_logp] * len(c))
    df = pd.DataFrame(
        {
            "prompt_ids": PROMPTS,
            "completion_ids": COMPLETIONS,
            "logprobs": logprobs,
            "loss_mask": [[1] * len(c) for c in COMPLETIONS],
            "advantage": np.array([1.0, -1.0, 0.5, -0.5]),
        }
    )
    return make_batch(df, pad_id=0, seed=3)


def _train_cfg(*sets: str):
    return load_config("configs/smoke.yaml", ["train.micro_batch_size=2", *sets]).train


def test_engine_anchor_needs_no_extra_forward_pass_and_reports_the_mismatch():
    eng = Engine()
    out = ppo_update(eng, _batch(None, eng.module), _train_cfg())
    assert eng.module.calls == 2  # two mini-batches, one forward each
    assert out["optimizer_steps"] == 2 and out["entropy"] > 0
    # measured on the first mini-batch, before its step: the engine's logprobs are the model's own
    assert out["logprob_mismatch_max"] < 1e-6 and out["mismatch_alarm"] == 0.0
    off = ppo_update(Engine(), _batch(0.0), _train_cfg())
    assert off["logprob_mismatch_mean"] > 0.5 and off["mismatch_alarm"] == 1.0


def test_recompute_anchor_costs_a_forward_pass_over_the_batch():
    eng = Engine()
    out = ppo_update(eng, _batch(0.0), _train_cfg("train.old_logprobs=recompute"))
    assert eng.module.calls == 4  # the recompute (two chunks of micro_batch_size), then two mini-batches
    # the mismatch is against the stored behaviour logprobs (0.0 here, far from the model's): the alarm fires
    assert out["logprob_mismatch_mean"] > 0.5 and out["mismatch_alarm"] == 1.0


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_corrections_weigh_tokens_by_anchor_over_behaviour(kind):
    eng = Engine()
    # behaviour logprob 0 (p = 1): every anchor/behaviour weight is p_model < 1; far below 1/2 for this model
    out = ppo_update(eng, _batch(0.0), _train_cfg("train.old_logprobs=recompute", f"train.correction={kind}"))
    assert 0 <= out["is_weight_mean"] < 1
    if kind == "mis":
        assert out["is_zeroed_frac"] == 1.0 and out["pg_loss"] == 0.0
    else:
        assert out["is_zeroed_frac"] == 0.0 and out["pg_loss"] != 0.0


def test_a_correction_without_the_recomputed_anchor_is_refused_naming_the_fields():
    with pytest.raises(ConfigError, match="train.correction=tis.*train.old_logprobs=recompute"):
        load_config("configs/smoke.yaml", ["train.correction=tis"])


def test_make_batch_names_a_row_without_a_prompt_and_takes_any_frame():
    """A row with no prompt token is refused naming it (its loss mask went to column -1: a numpy broadcast
    error); a reversed frame (negative strides) is laid out as its rows say."""
    rows = {
        "prompt_ids": [np.array([5, 6]), np.array([], dtype=np.int64)],
        "completion_ids": [np.array([9]), np.array([3, 4])],
        "logprobs": [np.array([-0.5]), np.array([-0.1, -0.2])],
        "loss_mask": [np.array([1]), np.array([1, 1])],
        "advantage": [1.0, -1.0],
    }
    with pytest.raises(ValueError, match="rollout row 1 has an empty prompt"):
        make_batch(pd.DataFrame(rows), pad_id=0)
    rows["prompt_ids"][1] = np.array([8])
    flipped = pd.DataFrame(rows).iloc[::-1].reset_index(drop=True)
    assert make_batch(flipped, pad_id=0).advantages.tolist() == [-1.0, 1.0]


def test_make_batch_lays_out_each_row_by_hand():
    """Right-padded prompt + completion; the loss mask and the engine's logprobs sit at the target positions
    of the completion tokens (position t predicts token t+1); an empty completion carries no loss."""
    df = pd.DataFrame(
        {
            "prompt_ids": [np.array([5, 6, 7]), np.array([8])],
            "completion_ids": [np.array([9, 2]), np.array([], dtype=np.int64)],
            "logprobs": [np.array([-0.5, -0.25]), np.array([])],
            "loss_mask": [np.array([1, 0]), np.array([], dtype=np.int64)],
            "advantage": [1.5, -1.0],
        }
    )
    b = make_batch(df, pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 9, 2], [8, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert b.rollout_logp.tolist() == [[0, 0, -0.5, -0.25], [0, 0, 0, 0]]
    assert b.advantages.tolist() == [1.5, -1.0]
    assert (b.input_ids.dtype, b.loss_mask.dtype, b.rollout_logp.dtype) == (
        torch.long,
        torch.float32,
        torch.float32,
    )
