"""How the train stage lays out its work: processes (world size, tensor parallel) and sequence packing, the
``train`` section's layout fields (``rl_core.schema.config.TrainSection`` inherits them; part of the one
schema, kept apart so that ``config.py`` stays readable); and the timing of the store's locks and when the
train stage's checkpoint is written (``store`` section); where and when the lineage records are written
(``tracking`` section).

    cfg = load_config("configs/smoke.yaml", ["train.world_size=2", "train.zero_stage=3"])
    cfg.train.launched   # True: each train stage is a torchrun job (rl_core/training/train_launch.py)

``world_size``, ``tp_size`` and what one forward holds (``forward_tokens``, ``forward_sequences``: gradient
accumulation) are placement (``rl_core.run.context.PLACEMENT``): left out of the run's config hash, so a run
resumes at another world size or on another GPU. Packing is not: it changes the float rounding of the
forwards.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class TrainLayoutFields(BaseModel):
    world_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="Processes of the train stage (data x tensor parallel). 1: in the flow's process, the "
        "engine held across iterations; more: a torchrun job per train stage. Where it runs, not what it "
        "computes: left out of the run's config hash, so a run can resume at another world size.",
    )
    tp_size: int = Field(
        1,
        ge=1,
        le=64,
        description="DeepSpeed AutoTP tensor-parallel degree (divides world_size; ZeRO stage 0-2). Left out "
        "of the config hash like world_size.",
    )

    packing: bool = Field(
        False,
        description="Pack each mini-batch's sequences (trimmed to their real lengths, first-fit decreasing) "
        "into rows of at most pack_tokens tokens for the train forwards and the no-grad recompute/reference "
        "passes, positions restarted and attention kept within each sequence; off = right-padded rows. "
        "Not for vision-language policies.",
    )
    pack_tokens: int = Field(
        0,
        ge=0,
        le=1_048_576,
        description="Token budget of one packed row (train.packing). 0 = the mini-batch's longest sequence "
        "(a row never holds more tokens than padding would). A sequence longer than the budget gets a row "
        "of its own. Attention cost per row grows with its square on CPU (sdpa/eager materialise the mask).",
    )

    forward_tokens: int | None = Field(
        None,
        ge=1,
        le=16_777_216,
        description="Token budget of one train forward on one rank: a rank's share of each mini-batch "
        "(train.micro_batch_size sequences, one optimizer step) is split, in order, into micro-batches of "
        "at most this many tokens (rows x the batch's width; packed: their real lengths), their gradients "
        "accumulated before the one step; the loss is normalised over the whole mini-batch as without it. A "
        "sequence longer than the budget gets a micro-batch of its own. None: on a GPU the memory plan's "
        "budget, on the CPU the whole share in one forward. Placement (left out of the config hash).",
    )
    forward_sequences: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="At most this many sequences in one train forward on one rank (with forward_tokens, "
        "both bounds hold). None: no bound. Placement, like forward_tokens.",
    )
    logits_chunk_mb: float = Field(
        512.0,
        ge=0,
        le=1_048_576,
        description="MiB of float32 logits one train or recompute forward may hold at once: past it, a text "
        "causal LM's head runs on chunks of positions (each chunk's logits recomputed in the backward), so a "
        "151,936-entry vocabulary does not hold B x T x V floats (rl_core/training/logprobs.py). The values "
        "are the whole-logits path's within float rounding. 0: always whole. Placement (left out of the "
        "config hash), like forward_tokens.",
    )

    @model_validator(mode="after")
    def _budget_needs_packing(self) -> Any:
        if self.pack_tokens and not self.packing:
            raise ValueError(
                f"train.pack_tokens={self.pack_tokens} is the budget of packed rows: set train.packing=true "
                "(or drop train.pack_tokens)"
            )
        return self

    @model_validator(mode="after")
    def _layout(self) -> Any:
        # zero_stage, backend, algorithm, checkpoint_every: fields of TrainSection, which mixes this in.
        s: Any = self
        if s.world_size % s.tp_size:
            raise ValueError(f"train.tp_size={s.tp_size} must divide train.world_size={s.world_size}")
        if s.tp_size > 1 and s.zero_stage == 3:
            raise ValueError("train.tp_size > 1 needs train.zero_stage 0, 1 or 2 (AutoTP is not ZeRO-3)")
        if s.launched and s.backend != "deepspeed":
            raise ValueError("train.world_size / train.tp_size > 1 need train.backend=deepspeed")
        if s.launched and s.algorithm == "ppo":
            raise ValueError("train.algorithm=ppo trains its critic in the flow's process: world_size 1")
        if s.launched and s.checkpoint_every != 1:
            raise ValueError(
                "train.checkpoint_every > 1 needs train.world_size=1: a launched train stage hands its "
                "weights back through the stored checkpoint, written every iteration"
            )
        return self

    @property
    def launched(self) -> bool:
        """Whether each train stage runs as its own torchrun job (world_size or tp_size above 1)."""
        return self.world_size > 1 or self.tp_size > 1


class StorePlacementFields(BaseModel):
    """The lock runs take on a shared base model's stage (``rl_core.artifacts.store_lock``) and when the train
    stage's checkpoint is written (``rl_core.artifacts.write_behind``): placement, not what any stage computes
    (left out of the config hash)."""

    lock_stale_after_s: float = Field(
        60.0,
        gt=0,
        description="A shared base-model stage's lock is abandoned when its heartbeat stops this long "
        "(or, on the same host, at once when its holder's process is gone).",
    )
    lock_heartbeat_s: float = Field(
        10.0, gt=0, description="How often a lock's holder writes its heartbeat (<= a third of the above)."
    )
    write_behind: Literal["auto"] | bool = Field(
        "auto",
        description="true: the train stage's checkpoint and optimizer state are written on a thread of "
        "their own while the iteration's last stages go on, the stage committed once they are written and "
        "nothing reading them before (rl_core.artifacts.write_behind); false: written in the stage; auto: "
        "behind when the store is remote (S3: the writes wait on the network), in the stage when local.",
    )

    @model_validator(mode="after")
    def _lock_timing(self) -> StorePlacementFields:
        if self.lock_heartbeat_s * 3 > self.lock_stale_after_s:
            raise ValueError(
                f"store.lock_heartbeat_s ({self.lock_heartbeat_s}) must be at most a third of "
                f"store.lock_stale_after_s ({self.lock_stale_after_s})"
            )
        return self


class TrackingPlacementFields(BaseModel):
    """Where and when the lineage records are written (``tracking`` section): placement, not what any stage
    computes (left out of the config hash)."""

    writes: Literal["auto", "inline", "background", "process"] = Field(
        "auto",
        description="Lineage writes inline, on a background thread or in a writer process; auto: when MLflow "
        "and the store are local (CPU work), the process for runs of 8 iterations or more, else inline; a "
        "thread across a network (rl_core.run.lineage).",
    )
    summary_every_s: float = Field(
        10.0,
        ge=0,
        description="Longest wait (seconds) before an iteration's summary on the experiment's MLflow run "
        "and its vital-sign table in the Prefect UI are written: iterations that end sooner are written "
        "together, one MLflow call and one table for all of them (flows.observe.RecordWindow). The first "
        "and the last iteration, and one with an alarm, are written at once. 0: each as it ends.",
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB)?\s*$", re.I)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


class CheckpointLayoutFields(BaseModel):
    """How the checkpoints a run writes are laid out (``model`` section): storage, not what any stage
    computes (left out of the config hash and of the base model's identity)."""

    max_shard_size: str = Field(
        "5GB",
        description="Checkpoints above this size are written as safetensors shards with an index, as "
        "save_pretrained(max_shard_size=...) writes them (e.g. 500MB, 5GB).",
    )

    @field_validator("max_shard_size")
    @classmethod
    def _size(cls, v: str) -> str:
        m = _SIZE.match(str(v))
        if not m or float(m.group(1)) <= 0:
            raise ValueError(f"model.max_shard_size {v!r}: a size such as 500MB or 5GB")
        return str(v)

    @property
    def max_shard_bytes(self) -> int:
        m = _SIZE.match(self.max_shard_size)
        assert m is not None
        return int(float(m.group(1)) * _UNITS[(m.group(2) or "B").upper()])
