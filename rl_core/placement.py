"""Placement and precision, decided once: from the config and what the machine has, the device, dtype and
attention kernel of every workload (trainer, reference, critic, warm-up, rollout engine, HF engine, reward
model, judge), the GPUs of the trainer and of the rollout engine, vLLM's GPU settings, and the memory plan
of each GPU. Everything that places a model asks here; nothing else reads ``torch.cuda``.

    machine = Machine.this()                         # or Machine.described("H200") to plan for one
    placement = plan(cfg, machine)                   # PlacementError (a ConfigError) if it cannot run
    placement.workloads["trainer"]    # Workload(device='cuda:0', dtype='bfloat16', attn='sdpa')
    placement.memory["gpus"]["0"]     # what GPU 0 holds in the train and generate phases, GiB

On a CPU machine every workload is ``cpu`` in float32 with sdpa attention unless asked otherwise: exactly what
the CPU path did before this module (the pinned smoke policy hashes hold). The memory plan is an estimate of
the largest terms (weights, float32 masters, Adam moments, gradients, activations of one micro-batch, the
logits of the loss, vLLM's share), not a measurement: a plan that does not fit stops the run before any work,
naming the phase, the GPU and the settings that would make it fit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_core.machine import GIB, GPU, KNOWN_GPUS, Machine, peak_tflops
from rl_core.overrides import ConfigError

__all__ = ["GPU", "KNOWN_GPUS", "Machine", "PlacementError", "Placement", "Workload", "peak_tflops", "plan"]
# Per process on a GPU: the CUDA context, cuBLAS/NCCL workspaces and the allocator's fragmentation.
PROCESS_RESERVE_GIB = 2.0
# Activation bytes per token per layer of a forward kept for backward, in units of hidden_size (bf16 forwards
# with a fused attention kernel, no recomputation: the usual ~34 * hidden bytes, plus the MLP's intermediate).
ACT_PER_HIDDEN = 34
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Workload:
    device: str  # "cpu" or "cuda:<index>"
    dtype: str  # "float32" or "bfloat16": weights held and forwards computed in it
    attn: str  # transformers' attn_implementation: "sdpa", "eager" or "flash_attention_2"

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class Shape:
    """The sizes the memory plan needs of the policy."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_dim: int  # key/value heads x head size


@dataclass(frozen=True)
class Placement:
    workloads: dict[str, Workload]
    trainer_gpus: tuple[int, ...] = ()
    rollout_gpus: tuple[int, ...] = ()
    colocated: bool = False  # the engine shares a trainer GPU and sleeps while the trainer steps
    vllm: dict[str, Any] = field(default_factory=dict)  # the engine's device-dependent LLM(...) arguments
    memory: dict[str, Any] | None = None  # per GPU and phase, GiB (None on CPU)
    machine: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """What the run's record keeps (rl_core.runs): where each workload ran and the memory plan."""
        return asdict(self)


class PlacementError(ConfigError):
    """The config cannot run on this machine (or the machine planned for): raised before any work."""


def model_shape(cfg: Any) -> Shape | None:
    """The policy's sizes: the built-in model's config fields, or a local ``model.path``'s config.json (None
    when the folder is remote or unreadable: no memory plan then)."""
    m = cfg.model
    if not m.path:
        h, layers, inter, vocab = m.hidden_size, m.num_layers, m.intermediate_size, m.vocab_size
        kv_dim, tied = h, False
    else:
        try:
            data = json.loads((Path(m.path) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        data = data.get("text_config", data)
        try:
            h, layers = int(data["hidden_size"]), int(data["num_hidden_layers"])
            inter, vocab = int(data["intermediate_size"]), int(data["vocab_size"])
            heads = int(data["num_attention_heads"])
            head_dim = int(data.get("head_dim") or h // heads)
            kv_dim = int(data.get("num_key_value_heads") or heads) * head_dim
            tied = bool(data.get("tie_word_embeddings", False))
        except (KeyError, TypeError, ValueError):
            return None
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * inter + 2 * h
    params = layers * per_layer + vocab * h * (1 if tied else 2) + h
    return Shape(params, layers, h, inter, vocab, kv_dim)


def _attn(cfg: Any, on_gpu: bool, dtype: str, machine: Machine) -> str:
    if cfg.train.attn != "auto":
        if cfg.train.attn == "flash_attention_2" and not (on_gpu and machine.flash_attn):
            raise PlacementError(
                "train.attn=flash_attention_2 needs a GPU and the flash-attn package "
                "(pip install flash-attn --no-build-isolation); use train.attn=auto"
            )
        return cfg.train.attn
    return "flash_attention_2" if on_gpu and machine.flash_attn and dtype == "bfloat16" else "sdpa"


def engine_dtype(cfg: Any) -> str:
    """The rollout engine's dtype: rollout.dtype, or with ``auto`` the trainer's.

    >>> from rl_core.config import Config
    >>> bf16 = Config.model_validate({"train": {"dtype": "bf16", "zero_stage": 1}})
    >>> engine_dtype(Config()), engine_dtype(bf16)
    ('float32', 'bfloat16')
    """
    return DTYPES[cfg.train.dtype] if cfg.rollout.dtype == "auto" else cfg.rollout.dtype


def _check_bf16(cfg: Any, machine: Machine, trainer_gpus: tuple[int, ...]) -> None:
    wants = cfg.train.dtype == "bf16" or engine_dtype(cfg) == "bfloat16"
    if not wants:
        return
    if trainer_gpus:
        old = [g for g in {machine.gpus[i] for i in trainer_gpus} if not g.bf16]
        if old:
            raise PlacementError(
                f"train.dtype=bf16: {old[0].name} (compute capability {old[0].capability[0]}."
                f"{old[0].capability[1]}) has no bf16 tensor cores (8.0+ needed); use train.dtype=fp32"
            )
    elif not machine.cpu_bf16:
        raise PlacementError(
            "train.dtype=bf16 / rollout.dtype=bfloat16 on this CPU: it has neither AVX512-BF16 nor AMX, so "
            "torch would emulate bf16 (slow, and not what a GPU computes); use train.dtype=fp32 and "
            "rollout.dtype=float32 here"
        )


def _gpus(cfg: Any, machine: Machine) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    n = len(machine.gpus)
    want = cfg.train.world_size
    engine = tuple(cfg.rollout.gpus)
    if not n:
        if engine:
            raise PlacementError(f"rollout.gpus={list(engine)}: this machine has no GPU")
        return (), (), False
    if any(g >= n for g in engine):
        raise PlacementError(f"rollout.gpus={list(engine)}: this machine has {n} GPU(s) (0..{n - 1})")
    free = [g for g in range(n) if g not in engine]
    if len(free) < want:
        raise PlacementError(
            f"train.world_size={want} needs {want} GPU(s) besides rollout.gpus={list(engine)}; this machine "
            f"has {n}: lower train.world_size or list fewer rollout.gpus ([] shares the trainer's)"
        )
    trainer = tuple(free[:want])
    colocated = not engine and cfg.rollout.engine == "vllm"
    if colocated and cfg.rollout.max_staleness > 0:
        raise PlacementError(
            f"rollout.max_staleness={cfg.rollout.max_staleness} generates while the trainer steps, but a "
            "colocated engine (rollout.gpus=[]) sleeps then: give the engine its own rollout.gpus"
        )
    return trainer, (engine or trainer[:1]), colocated


def plan(cfg: Any, machine: Machine) -> Placement:
    """Where and in what precision every workload of ``cfg`` runs on ``machine``; PlacementError if it
    cannot (no GPU for a GPU setting, bf16 without support, a memory plan that does not fit)."""
    trainer_gpus, rollout_gpus, colocated = _gpus(cfg, machine)
    _check_bf16(cfg, machine, trainer_gpus)
    on_gpu = bool(trainer_gpus)
    compute = DTYPES[cfg.train.dtype]
    attn = _attn(cfg, on_gpu, compute, machine)
    first = f"cuda:{trainer_gpus[0]}" if on_gpu else "cpu"
    eng_device = f"cuda:{rollout_gpus[0]}" if on_gpu else "cpu"
    eng_dtype = engine_dtype(cfg)
    workloads = {
        # The trainer's rank r runs on trainer_gpus[r] (cuda:LOCAL_RANK under the launcher).
        "trainer": Workload(first, compute, attn),
        "reference": Workload(first, compute, attn),
        "critic": Workload(first, "float32", "sdpa"),
        "warmup": Workload(first, "float32", "sdpa"),
        "rollout": Workload(eng_device, eng_dtype, "vllm" if cfg.rollout.engine == "vllm" else attn),
        "hf_engine": Workload(eng_device, eng_dtype, _attn(cfg, on_gpu, eng_dtype, machine)),
        "reward_model": Workload(first, "float32", "sdpa"),
        "judge": Workload(first, "float32", "sdpa"),
    }
    vllm = _vllm_args(cfg, on_gpu, colocated, len(rollout_gpus) if cfg.rollout.gpus else 1)
    memory = None
    shape = model_shape(cfg)
    if on_gpu and shape is not None:
        memory = memory_plan(cfg, machine, shape, trainer_gpus, rollout_gpus, colocated)
    return Placement(workloads, trainer_gpus, rollout_gpus, colocated, vllm, memory, machine.describe())


def cpu_vllm_args(max_model_len: int, kv_cache_mb: int) -> dict[str, Any]:
    """vLLM's device arguments on the CPU, as measured there: a KV cache of ``kv_cache_mb`` (else it reserves
    most of the host's memory), eager, and never a prompt's prefill split across steps (vLLM then rewinds the
    request's generator, which CPU generators cannot do: "CPU Generator does not use offset"), so one step's
    token budget holds every prompt of a batch.

    >>> cpu_vllm_args(64, 256)["max_num_batched_tokens"]
    16384
    """
    return {
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(8192, 256 * max_model_len),
        "kv_cache_memory_bytes": kv_cache_mb << 20,
    }


def _vllm_args(cfg: Any, on_gpu: bool, colocated: bool, tp: int) -> dict[str, Any]:
    r = cfg.rollout
    if not on_gpu:
        return cpu_vllm_args(cfg.model.max_position, r.kv_cache_mb)
    return {
        "enforce_eager": not r.cuda_graphs,
        "enable_chunked_prefill": r.chunked_prefill,
        "max_num_batched_tokens": max(r.max_num_batched_tokens, cfg.model.max_position)
        if not r.chunked_prefill
        else r.max_num_batched_tokens,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "tensor_parallel_size": tp,
        "enable_sleep_mode": colocated,
    }


def trainer_terms(cfg: Any, shape: Shape) -> dict[str, float]:
    """Bytes one trainer rank holds, by term: weights in the compute dtype, float32 masters (bf16), Adam's
    two float32 moments, gradients (sharded by ZeRO stage 1/2/3 and AutoTP), the reference and critic
    models when the algorithm needs them, one micro-batch's activations and the loss's float32 logits."""
    t = cfg.train
    p = shape.params
    dp = max(1, t.world_size // t.tp_size)
    w = BYTES[DTYPES[t.dtype]]
    states = dp if t.zero_stage >= 1 else 1
    grads = dp if t.zero_stage >= 2 else 1
    params = dp if t.zero_stage >= 3 else 1
    tp = t.tp_size
    terms = {
        "weights": p * w / params / tp,
        "fp32_masters": (p * 4 if t.dtype == "bf16" else 0) / states / tp,
        "adam_moments": p * 8 / states / tp,
        "gradients": p * w / grads / tp,
    }
    if t.kl_coef > 0 or t.algorithm == "ppo":
        terms["reference"] = p * w / tp
    if t.algorithm == "ppo":
        terms["critic"] = p * 16.0  # float32 weights, gradients, Adam moments
    tokens = max(1, t.micro_batch_size // dp) * cfg.model.max_position  # packed rows hold no more
    per_layer = ACT_PER_HIDDEN * shape.hidden + 4 * shape.intermediate
    terms["activations"] = tokens * shape.layers * per_layer * (w / 2)
    terms["logits"] = tokens * shape.vocab * 4 * 3  # float32 logits, log-softmax and their gradient
    return terms


RESIDENT = ("weights", "fp32_masters", "adam_moments", "reference", "critic")


def memory_plan(
    cfg: Any,
    machine: Machine,
    shape: Shape,
    trainer_gpus: tuple[int, ...],
    rollout_gpus: tuple[int, ...],
    colocated: bool,
) -> dict[str, Any]:
    """GiB per GPU and phase, with the terms; PlacementError naming the first GPU and phase that overflow.

    The train phase holds the trainer's peak (every term) and the engine asleep (its process reserve) or,
    on a GPU of its own, awake; the generate phase holds the trainer's resident terms and the engine's
    whole share (rollout.gpu_memory_utilization of the GPU)."""
    terms = trainer_terms(cfg, shape)
    resident = sum(v for k, v in terms.items() if k in RESIDENT) / GIB
    peak = sum(terms.values()) / GIB
    gib = {k: round(v / GIB, 2) for k, v in terms.items()}
    vllm_gpus = set(rollout_gpus) if cfg.rollout.engine == "vllm" else set()
    gpus: dict[str, Any] = {}
    for i in sorted(set(trainer_gpus) | vllm_gpus):
        gpu = machine.gpus[i]
        entry: dict[str, Any] = {"name": gpu.name, "total_gib": round(gpu.memory_gib, 1)}
        train = gen = 0.0
        if i in trainer_gpus:
            entry["trainer_gib"] = gib
            train, gen = peak + PROCESS_RESERVE_GIB, resident + PROCESS_RESERVE_GIB
        if i in vllm_gpus:
            share = _engine_share(cfg, shape, i, gpu, len(rollout_gpus) if cfg.rollout.gpus else 1)
            entry["engine_gib"] = round(share, 2)
            gen += share
            train += PROCESS_RESERVE_GIB if colocated else share
        entry["train_phase_gib"], entry["generate_phase_gib"] = round(train, 2), round(gen, 2)
        for phase, need in (("train", train), ("generate", gen)):
            if need > gpu.memory_gib:
                raise PlacementError(
                    f"memory plan: GPU {i} ({gpu.name}, {gpu.memory_gib:.1f} GiB) needs {need:.1f} GiB in "
                    f"the {phase} phase ({_largest(gib)}"
                    + (f", vLLM {entry['engine_gib']:.1f}" if i in vllm_gpus and phase == "generate" else "")
                    + "): lower train.micro_batch_size or model.max_position, raise train.zero_stage or "
                    "train.world_size, lower rollout.gpu_memory_utilization, or give the engine its own "
                    "rollout.gpus"
                )
        gpus[str(i)] = entry
    tokens = max(1, cfg.train.micro_batch_size // max(1, cfg.train.world_size // cfg.train.tp_size))
    return {"gpus": gpus, "params": shape.params, "tokens_per_micro_batch": tokens * cfg.model.max_position}


def _engine_share(cfg: Any, shape: Shape, i: int, gpu: GPU, tp: int) -> float:
    """GiB vLLM takes on GPU ``i``; PlacementError when that share cannot hold the weights and the KV cache
    of one longest sequence."""
    util = cfg.rollout.gpu_memory_utilization
    share = util * gpu.memory_gib
    width = BYTES[engine_dtype(cfg)]
    weights = shape.params * width / tp / GIB
    kv = 2 * shape.layers * shape.kv_dim * width * cfg.model.max_position / tp / GIB
    if weights + kv > share:
        raise PlacementError(
            f"memory plan: GPU {i} ({gpu.name}, {gpu.memory_gib:.1f} GiB): vLLM's share "
            f"rollout.gpu_memory_utilization={util} ({share:.1f} GiB) cannot hold the weights ({weights:.1f} "
            f"GiB) and one {cfg.model.max_position}-token sequence's KV cache: raise it"
            + (" or list more rollout.gpus" if cfg.rollout.gpus else "")
        )
    return share


def _largest(gib: dict[str, float]) -> str:
    top = sorted(gib.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v:.1f}" for k, v in top)
