"""The settings a GPU run needs: the trainer's precision and attention kernel (``train`` section), and the
rollout engine's GPUs and vLLM memory settings (``rollout`` section). Part of the one schema
(``rl_core.schema.config`` mixes them in), kept apart so that ``config.py`` stays readable; what each workload
actually gets on a given machine is decided in one place, ``rl_core.models.placement``.

    cfg = load_config("configs/gpu.yaml")
    cfg.train.dtype, cfg.rollout.gpus   # 'bf16', [] (the engine shares the trainer's GPU, asleep in train)

On a CPU machine the defaults reproduce the CPU path exactly (fp32, sdpa, eager vLLM). The rollout engine's
GPUs and memory settings are placement (``rl_core.run.context.PLACEMENT``): left out of the run's config hash.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class TrainDeviceFields(BaseModel):
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Trainer precision. bf16: DeepSpeed's bf16 mode (bf16 forwards and gradients, float32 "
        "master weights and Adam moments in the ZeRO optimizer; needs train.backend=deepspeed and "
        "train.zero_stage >= 1), the reference model and the rollout engine in bf16 too (rollout.dtype "
        "auto). Needs a GPU of compute capability 8.0+ or a CPU with AVX512-BF16/AMX.",
    )
    attn: Literal["auto", "sdpa", "eager", "flash_attention_2", "flex_attention"] = Field(
        "auto",
        description="Attention kernel of the trainer, reference, critic and HF engine. auto: "
        "flash_attention_2 on a GPU in bf16 when the flash-attn package is installed (packed rows then run "
        "its variable-length kernel); else, on a GPU with train.packing, flex_attention for the trainer and "
        "reference (torch's document-masked kernel: packed rows without a dense mask, no extra package); "
        "else sdpa. flex_attention needs a GPU (no CPU backward) and compiles once per shape; the HF "
        "engine keeps sdpa.",
    )

    @model_validator(mode="after")
    def _bf16_path(self) -> Any:
        s: Any = self  # backend, zero_stage: fields of TrainSection, which mixes this in
        if s.dtype == "bf16" and (s.backend != "deepspeed" or s.zero_stage < 1):
            raise ValueError(
                "train.dtype=bf16 needs train.backend=deepspeed and train.zero_stage >= 1: the float32 "
                "master weights live in DeepSpeed's ZeRO optimizer"
            )
        if s.dtype == "bf16" and s.tp_size > 1:
            raise ValueError(
                "train.dtype=bf16 with train.tp_size > 1 is not supported: the float32 masters of AutoTP "
                "shards are not gathered into checkpoints yet; use tp_size 1 (ZeRO shards instead)"
            )
        if s.attn == "flash_attention_2" and s.dtype != "bf16":
            raise ValueError("train.attn=flash_attention_2 needs train.dtype=bf16 (flash-attn has no fp32)")
        return self


class RolloutDeviceFields(BaseModel):
    gpus: list[int] = Field(
        [],
        max_length=64,
        description="GPUs of the in-process vLLM engine (tensor parallel over them); [] = colocated: the "
        "engine shares the trainer's GPU and sleeps (weights offloaded, KV cache freed) while it trains. "
        "The trainer takes the first train.world_size GPUs not listed here.",
    )
    gpu_memory_utilization: float = Field(
        0.45,
        gt=0.0,
        lt=1.0,
        description="Share of each engine GPU's memory vLLM may take (weights, activations, KV cache, "
        "CUDA graphs). Colocated, the trainer's resident memory must fit in the rest.",
    )
    max_num_batched_tokens: int = Field(
        8192,
        ge=256,
        le=1_048_576,
        description="vLLM's token budget per scheduler step (on a GPU: chunked prefill splits longer "
        "prompts; it bounds the profile run's activation memory). CPU: max_model_len x the batch, as before.",
    )
    reward_gpu_memory_utilization: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="Share of the rollout engine's first GPU that each reward engine takes on a GPU machine: "
        "the LLM judge's vLLM engine (reward.weights has judge; it sleeps with the policy's engine while a "
        "colocated trainer steps) and the reward server the flow starts (reward.model.path). On CPU they get "
        "a KV cache of their kv_cache_mb instead.",
    )
    chunked_prefill: bool = Field(True, description="vLLM chunked prefill on a GPU (off on CPU).")
    cuda_graphs: bool = Field(
        True, description="vLLM CUDA graphs on a GPU (false = enforce_eager); always eager on CPU."
    )

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(g < 0 for g in v):
            raise ValueError(f"rollout.gpus must be distinct GPU indices >= 0, got {v}")
        return v
