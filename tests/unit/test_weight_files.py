"""Checkpoint weights as files (rl_core/models/model.py): one model.safetensors exactly as before up to
``model.max_shard_size`` (the policy hashes of every existing run stay), shards with their index above it,
a tied model's head left out, and a digest that covers the index and every shard."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load, save

from rl_core.models.model import INDEX, WEIGHTS, weight_files, weights_digest
from rl_core.schema.config import ConfigError, load_config


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    sd = {f"model.layers.{i}.w": torch.randn(64, 64, generator=g) for i in range(6)}
    sd["model.embed_tokens.weight"] = torch.randn(32, 64, generator=g)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def test_one_file_is_the_bytes_it_always_was():
    sd = {k: v.clone() for k, v in _state().items()}  # untied: a head of its own
    files = weight_files(sd)
    assert list(files) == [WEIGHTS]
    assert files[WEIGHTS] == save({k: v.contiguous() for k, v in sd.items()}, metadata={"format": "pt"})


def test_above_the_shard_size_shards_and_an_index_that_reassemble_the_weights():
    sd = _state()
    files = weight_files(sd, tied=True, max_shard_bytes=40_000)  # each 64x64 fp32 tensor is 16 KB
    index = json.loads(files.pop(INDEX))
    assert WEIGHTS not in files and len(files) >= 3
    assert all(
        len(b) < 40_000 + 16_500 for b in files.values()
    )  # a shard holds what fits, at least one tensor
    back = {k: v for b in files.values() for k, v in load(b).items()}
    assert set(back) == set(sd) - {"lm_head.weight"}  # tied: the head is the embedding, not stored
    assert all(torch.equal(back[k], sd[k]) for k in back)
    assert index["weight_map"] == {k: n for n, b in files.items() for k in load(b)}
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for k, v in back.items())


def test_the_digest_covers_the_index_and_every_shard():
    one = {WEIGHTS: "a" * 64, "config.json": "c" * 64}
    assert weights_digest(one) == "a" * 64
    shards = {
        INDEX: "i" * 64,
        "model-00001-of-00002.safetensors": "1" * 64,
        "model-00002-of-00002.safetensors": "2" * 64,
    }
    d = weights_digest({**shards, "config.json": "c" * 64})
    assert d == weights_digest(shards)  # other files do not count
    assert d != weights_digest({**shards, "model-00002-of-00002.safetensors": "3" * 64})
    with pytest.raises(KeyError, match="no weight files"):
        weights_digest({"config.json": "c" * 64})


def test_the_shard_size_is_checked_and_is_not_part_of_the_config_hash():
    from rl_core.run.context import base_id, run_config_hash

    assert load_config(None, ["model.max_shard_size=500MB"]).model.max_shard_bytes == 500_000_000
    with pytest.raises(ConfigError, match="model.max_shard_size"):
        load_config(None, ["model.max_shard_size=lots"])
    a, b = load_config(None), load_config(None, ["model.max_shard_size=1MB"])
    assert run_config_hash(a) == run_config_hash(b) and base_id(a) == base_id(b)
