"""The memory plan of a GPU run: what one trainer rank holds, term by term (weights, float32 masters, Adam
moments, gradients, reference, critic, one micro-batch's activations, the loss's logits), what the rollout
engine, the judge's engine and a reward server take beside it, per GPU and phase (train, generate) — an
estimate of the largest terms, not a measurement. ``rl_core.models.placement.plan`` calls it and stores the
result in the run's record; a plan that does not fit raises ``PlacementError`` before any work, naming the
GPU, the phase and the settings that would make it fit.

    shape = model_shape(cfg)                                  # the policy's sizes (None: remote folder)
    trainer_terms(cfg, shape)["adam_moments"]                 # bytes per rank
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_core.models.machine import GIB, GPU, Machine, PlacementError

# Per process on a GPU: the CUDA context, cuBLAS/NCCL workspaces and the allocator's fragmentation.
PROCESS_RESERVE_GIB = 2.0
# Activation bytes per token per layer of a forward kept for backward, in units of hidden_size (bf16 forwards
# with a fused attention kernel, no recomputation: the usual ~34 * hidden bytes, plus the MLP's intermediate).
ACT_PER_HIDDEN = 34
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Shape:
    """The sizes the memory plan needs of the policy."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_dim: int  # key/value heads x head size
    head_dim: int = 0  # one attention head's size (0: unknown)
    vision: bool = False  # a vision-language model: its logits are taken whole (rl_core/training/logprobs.py)


def model_shape(cfg: Any) -> Shape | None:
    """The policy's sizes: the built-in model's config fields, or a local ``model.path``'s config.json (None
    when the folder is remote or unreadable: no memory plan then)."""
    m = cfg.model
    if not m.path:
        h, layers, inter, vocab = m.hidden_size, m.num_layers, m.intermediate_size, m.vocab_size
        kv_dim, tied, head_dim, vision = h, False, h // m.num_heads, False
    else:
        try:
            data = json.loads((Path(m.path) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        vision = "vision_config" in data
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
    return Shape(params, layers, h, inter, vocab, kv_dim, head_dim, vision)


def share_tokens(cfg: Any) -> int:
    """The tokens of one rank's whole share of a mini-batch (its rows at model.max_position)."""
    dp = max(1, cfg.train.world_size // cfg.train.tp_size)
    return max(1, cfg.train.micro_batch_size // dp) * cfg.model.max_position


def trainer_terms(cfg: Any, shape: Shape, forward_tokens: int | None = None) -> dict[str, float]:
    """Bytes one trainer rank holds, by term: weights in the compute dtype, float32 masters (bf16), Adam's
    two float32 moments, gradients (sharded by ZeRO stage 1/2/3 and AutoTP), the reference and critic
    models when the algorithm needs them, one forward's activations and the loss's float32 logits (a forward
    of ``forward_tokens`` tokens, else of the rank's whole share)."""
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
    tokens = min(share_tokens(cfg), forward_tokens or share_tokens(cfg))  # packed rows hold no more
    per_layer = ACT_PER_HIDDEN * shape.hidden + 4 * shape.intermediate
    terms["activations"] = tokens * shape.layers * per_layer * (w / 2)
    terms["logits"] = tokens * shape.vocab * 4 * 3  # float32 logits, log-softmax and their gradient
    if t.logits_chunk_mb and not shape.vision:  # a text model's head in chunks of at most this much
        terms["logits"] = min(terms["logits"], t.logits_chunk_mb * 2**20)
    return terms


RESIDENT = ("weights", "fp32_masters", "adam_moments", "reference", "critic")


def memory_plan(cfg: Any, machine: Machine, shape: Shape, *where: Any, **how: Any) -> dict[str, Any]:
    """GiB per GPU and phase (``planned``) with the token budget of one train forward,
    ``train.forward_tokens`` when set, else the largest that fits the train phase, from the rank's whole share
    halving down to one sequence (``forward_tokens`` in the plan: the train engine's budget).
    PlacementError naming the plan when even one ``model.max_position`` sequence per forward does not fit
    (or what overflows is not the forward's)."""
    if cfg.train.forward_tokens:
        return {**planned(cfg, machine, shape, *where, **how), "forward_tokens": cfg.train.forward_tokens}
    rows = share_tokens(cfg) // cfg.model.max_position
    while True:
        budget = rows * cfg.model.max_position
        try:
            plan = planned(cfg, machine, shape, *where, **how, forward_tokens=budget)
            return {**plan, "forward_tokens": budget}
        except PlacementError as e:
            if "train phase" not in str(e):
                raise
            if rows == 1:
                raise PlacementError(
                    f"{e}; even one {cfg.model.max_position}-token sequence per forward "
                    f"(train.forward_tokens={budget}) does not fit: lower model.max_position, or spread the "
                    "model (train.zero_stage 3, more train.world_size or train.tp_size)"
                ) from None
            rows //= 2


def planned(
    cfg: Any,
    machine: Machine,
    shape: Shape,
    trainer_gpus: tuple[int, ...],
    rollout_gpus: tuple[int, ...],
    colocated: bool,
    engine_dtype: str,
    rollout_engine: str = "vllm",
    forward_tokens: int | None = None,
) -> dict[str, Any]:
    """GiB per GPU and phase, with the terms; PlacementError naming the first GPU and phase that overflow.

    The train phase holds the trainer's peak (every term) and the engine asleep (its process reserve) or,
    on a GPU of its own, awake; the generate phase holds the trainer's resident terms and the engine's
    whole share (rollout.gpu_memory_utilization of the GPU); with an LLM judge on vLLM, the rollout engine's
    first GPU also holds the judge's (rollout.reward_gpu_memory_utilization), asleep in the train phase when
    colocated, and a reward server the flow starts holds as much there in both phases."""
    terms = trainer_terms(cfg, shape, forward_tokens or cfg.train.forward_tokens)
    resident = sum(v for k, v in terms.items() if k in RESIDENT) / GIB
    peak = sum(terms.values()) / GIB
    gib = {k: round(v / GIB, 2) for k, v in terms.items()}
    vllm_gpus = set(rollout_gpus) if rollout_engine == "vllm" else set()
    servers = cfg.rollout.servers if cfg.rollout.gpus and not cfg.rollout.server_urls else 0
    tp = len(rollout_gpus) // max(1, servers) if cfg.rollout.gpus else 1
    judged = "judge" in cfg.reward.weights and cfg.reward.judge.engine == "vllm"
    served = "reward_model" in cfg.reward.weights and bool(cfg.reward.model.path) and not cfg.reward.model.url
    gpus: dict[str, Any] = {}
    for i in sorted(set(trainer_gpus) | vllm_gpus):
        gpu = machine.gpus[i]
        entry: dict[str, Any] = {"name": gpu.name, "total_gib": round(gpu.memory_gib, 1)}
        # each term on this GPU: (entry key, GiB, GiB in the train phase, GiB in the generate phase)
        held: list[tuple[str, Any, float, float]] = []
        if i in trainer_gpus:
            held.append(("trainer_gib", gib, peak + PROCESS_RESERVE_GIB, resident + PROCESS_RESERVE_GIB))
        if i in vllm_gpus:
            share = _engine_share(cfg, shape, i, gpu, tp, engine_dtype)
            held.append(("engine_gib", round(share, 2), PROCESS_RESERVE_GIB if colocated else share, share))
        reward_share = cfg.rollout.reward_gpu_memory_utilization * gpu.memory_gib
        if judged and i == rollout_gpus[0]:  # the judge's engine, beside the policy's, asleep with it
            asleep = PROCESS_RESERVE_GIB if colocated else reward_share
            held.append(("judge_gib", round(reward_share, 2), asleep, reward_share))
        if served and i == rollout_gpus[0]:  # the reward server: another process, awake throughout
            held.append(("reward_server_gib", round(reward_share, 2), reward_share, reward_share))
        entry.update({key: value for key, value, _, _ in held})
        train, gen = sum(h[2] for h in held), sum(h[3] for h in held)
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
    return {"gpus": gpus, "params": shape.params, "tokens_per_micro_batch": share_tokens(cfg)}


def _engine_share(cfg: Any, shape: Shape, i: int, gpu: GPU, tp: int, engine_dtype: str) -> float:
    """GiB vLLM takes on GPU ``i``; PlacementError when that share cannot hold the weights and the KV cache
    of one longest sequence."""
    util = cfg.rollout.gpu_memory_utilization
    share = util * gpu.memory_gib
    width = BYTES[engine_dtype]
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
