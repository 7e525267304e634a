"""Micro-batches that fit (issue 43, item 3): the sequences of one optimizer step (``train.micro_batch_size``)
are split from what one forward holds (``train.forward_sequences`` / ``train.forward_tokens``), gradients
accumulated, the loss normalised over the whole mini-batch: one 64-sequence mini-batch as 1, 4 and
token-budget micro-batches gives the same update within 1e-6 (fp32), on the plain torch engine and on
DeepSpeed at one rank; every rank runs as many forwards as the most loaded one. The memory plan chooses the
token budget from a GPU's memory and refuses, naming the plan, a config whose one sequence cannot fit."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from rl_core.models.placement import Machine, PlacementError, plan
from rl_core.schema.config import load_config
from rl_core.training.micro_batches import rank_micro_batches
from rl_core.training.ppo import make_batch, ppo_update
from rl_core.training.train_engine import make_train_engine


def _batch(n: int = 64, seed: int = 0, pack: int | None = None):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, 60, rng.integers(2, 6))) for _ in range(n)]
    completions = [list(rng.integers(3, 60, rng.integers(1, 9))) for _ in range(n)]
    df = pd.DataFrame(
        {
            "prompt_ids": prompts,
            "completion_ids": completions,
            "logprobs": [list(rng.normal(-2.0, 0.3, len(c))) for c in completions],
            "loss_mask": [[1] * len(c) for c in completions],
            "advantage": rng.normal(0, 1, n).astype(np.float32),
        }
    )
    return make_batch(df, pad_id=0, seed=5, pack_tokens=pack)


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).float()


def _train(backend: str, *sets: str, pack: int | None = None) -> tuple[dict, dict]:
    tc = load_config("configs/smoke.yaml", ["train.micro_batch_size=64", "train.lr=1e-3", *sets]).train
    engine = make_train_engine(backend, _model(), tc)
    try:
        out = ppo_update(engine, _batch(pack=pack), tc)
        return out, engine.weights()
    finally:
        engine.close()


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    """DeepSpeed's engines of this module share one world of one (as the flow's process does); it is taken
    down at the end, with DeepSpeed's clone of it, so that a later module starts a fresh one."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
        from deepspeed.utils import groups

        groups._WORLD_GROUP = None
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_one_four_and_token_budget_micro_batches_make_the_same_update(backend):
    width = _batch().input_ids.shape[1]
    whole, w_whole = _train(backend)
    assert whole["optimizer_steps"] == 1.0
    start = _model().state_dict()
    moved = max(float((w_whole[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4  # the update moved the weights: equal weights below mean an equal update
    for sets in (["train.forward_sequences=16"], [f"train.forward_tokens={10 * width}"]):
        out, w = _train(backend, *sets)
        assert out["optimizer_steps"] == 1.0
        for k in w_whole:
            torch.testing.assert_close(w[k], w_whole[k], atol=1e-6, rtol=0)
        # the gradient norm before clipping and the loss see the scale of the accumulated gradient, which
        # AdamW's update alone would hide
        assert out["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
        assert out["loss"] == pytest.approx(whole["loss"], rel=1e-5, abs=1e-7)
        assert out["entropy"] == pytest.approx(whole["entropy"], rel=1e-6)


def test_packed_rows_are_budgeted_by_their_real_lengths():
    whole, w_whole = _train("torch", "train.packing=true", pack=0)
    out, w = _train("torch", "train.packing=true", "train.forward_tokens=64", pack=0)
    for k in w_whole:
        torch.testing.assert_close(w[k], w_whole[k], atol=1e-6, rtol=0)
    assert out["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)


def test_every_rank_runs_as_many_micro_batches_as_the_most_loaded():
    mb = torch.arange(10)
    costs = torch.tensor([9, 1, 1, 1, 9, 1, 9, 1, 1, 1])  # rank 0 gets the long rows 0, 4, 6
    per_rank = [rank_micro_batches(mb, costs, 2, r, tokens=10, sequences=None) for r in range(2)]
    assert [len(g) for g in per_rank] == [3, 3]
    assert [g.tolist() for g in per_rank[0]] == [[0, 2], [4], [6, 8]]
    assert [g.tolist() for g in per_rank[1]] == [[1, 3, 5, 7, 9], [], []]  # two forwards that add nothing
    assert sorted(i for g in per_rank for part in g for i in part.tolist()) == list(range(10))
    assert [g.tolist() for g in rank_micro_batches(mb, costs, 2, 1, None, None)] == [[1, 3, 5, 7, 9]]


def test_the_memory_plan_chooses_the_budget_and_refuses_what_cannot_fit():
    big = [
        "model.hidden_size=4096",
        "model.num_layers=32",
        "model.num_heads=32",
        "model.intermediate_size=11008",
        "model.vocab_size=65536",
        "model.max_position=8192",
        "train.micro_batch_size=256",
        "train.world_size=8",
        "train.dtype=bf16",
        "train.zero_stage=3",
        "rollout.engine=vllm",
    ]
    eight = Machine.described("H200", 8)
    placed = plan(load_config("configs/smoke.yaml", big), eight)
    budget = placed.memory["forward_tokens"]
    share = 256 // 8 * 8192
    assert (
        8192 <= budget < share and budget % 8192 == 0
    )  # less than a rank's whole share, at least a sequence
    fixed = plan(load_config("configs/smoke.yaml", [*big, "train.forward_tokens=16384"]), eight)
    assert fixed.memory["forward_tokens"] == 16384
    # a context whose one sequence's activations and logits overflow the GPU (the HF engine: no vLLM share)
    long = [*big, "model.max_position=131072", "rollout.engine=hf"]
    with pytest.raises(PlacementError, match=r"train phase.*even one 131072-token sequence per forward"):
        plan(load_config("configs/smoke.yaml", long), eight)
