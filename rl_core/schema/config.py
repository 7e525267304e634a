"""The experiment schema: one pydantic model, every field described once.

Load a YAML file with overrides:

    cfg = load_config("configs/default.yaml", ["train.lr=2e-5", "rollout.engine=hf"])

A bad value fails before any work, with the dotted field name and the allowed values.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_core.schema.config_alarms import AlarmsSection
from rl_core.schema.config_cluster import ClusterSection
from rl_core.schema.config_device import RolloutDeviceFields, TrainDeviceFields
from rl_core.schema.config_eval import EvalSection, EvalSuite  # noqa: F401  (EvalSuite: part of the schema's API)
from rl_core.schema.config_layout import (
    CheckpointLayoutFields,
    StorePlacementFields,
    TrackingPlacementFields,
    TrainLayoutFields,
)
from rl_core.schema.config_pg import PolicyGradientFields
from rl_core.schema.config_reward import AuditSettings, JudgeSettings, RewardModelSettings, check_reward_names
from rl_core.schema.config_sampling import SamplingFields
from rl_core.schema.config_secrets import NoCredentials
from rl_core.schema.overrides import (
    ConfigError,
    format_validation_error,
    parse_overrides,
    read_yaml,
    set_dotted,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ExperimentSection(_Section):
    # the MLflow experiment's and registered model's name: letters, digits, '.', '_' and '-'
    name: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", description="Experiment name.")
    seed: int = Field(0, ge=0, description="Run seed; every other seed is derived from it.")
    iterations: int = Field(50, ge=1, le=100_000, description="Number of RL iterations (one flow run each).")


class ModelSection(_Section, CheckpointLayoutFields):
    path: str = Field(
        "",
        description="Your own policy: a Hugging Face save_pretrained folder (a local path, file:// or an "
        "fsspec URL such as s3://bucket/model) with config.json, model.safetensors, tokenizer.json (and "
        "its chat template) and generation_config.json, used as saved. Empty = build the tiny policy "
        "below (the architecture and vocab_size fields are then ignored).",
    )
    chat_template: bool | Literal["auto"] = Field(
        "auto",
        description="Render each text prompt as a user message with the tokenizer's chat template: true, "
        "false (the prompt's text as is), or auto (when the tokenizer has a template). Prompts given as chat "
        "messages always use the template.",
    )
    hidden_size: int = Field(128, ge=16, le=8192, description="Width of the tiny Qwen2 policy.")
    num_layers: int = Field(4, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(2, ge=1, le=128, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(512, ge=16, description="MLP width.")
    vocab_size: int = Field(
        64, ge=32, le=65536, description="Target size of the BPE tokenizer trained on task text."
    )
    max_position: int = Field(64, ge=16, description="Longest sequence (prompt + completion) in tokens.")
    vision_hidden_size: int = Field(
        64, ge=32, le=4096, description="Width of the vision tower (multimodal environments only)."
    )
    vision_layers: int = Field(
        2, ge=1, le=64, description="Vision tower blocks (multimodal environments only)."
    )
    patch_size: int = Field(
        8, ge=1, le=64, description="Image patch side in pixels; each patch is one image token."
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        """A local folder is recorded as an absolute path: a resumed run may start from another directory."""
        if not v or "://" in v:
            return v
        return str(Path(v).expanduser().resolve())


def _moved(data: Any, section: str, moved: dict[str, str]) -> Any:
    """An error naming a field's new home when an old config still sets it (nothing is silently ignored)."""
    if isinstance(data, dict):
        for old, new in moved.items():
            if old in data:
                raise ValueError(f"{section}.{old} moved: set {new} instead")
    return data


class TaskSection(_Section):
    env: str = Field(
        "arithmetic",
        description="Environment: a registered name, 'module:Class' (your own package), or the name an "
        "installed package declares under the 'rlfoundry.envs' entry points.",
    )
    env_args: dict[str, Any] = Field(
        {},
        description="The environment's own options, validated by its config model (arithmetic: operations, "
        "digits; countup: digits). Stored with every default filled in.",
    )
    train_size: int = Field(
        10_000, ge=10, description="Number of training problems (disjoint from held-out)."
    )
    heldout_size: int = Field(256, ge=10, description="Number of held-out evaluation problems.")
    executor: Literal["inline", "process", "ray"] = Field(
        "process",
        description="Where execute_envs runs episodes: inline, a local process pool, or Ray (fleets).",
    )
    env_workers: int = Field(
        2, ge=1, le=4096, description="Processes (or Ray actors, a CPU each) for environments."
    )
    ray_address: str = Field(
        "",
        description="Ray cluster address for executor=ray (e.g. ray://head:10001); empty = a local cluster.",
    )

    @model_validator(mode="before")
    @classmethod
    def _env_options_moved(cls, data: Any) -> Any:
        return _moved(data, "task", {k: f"task.env_args.{k}" for k in ("operations", "digits")})

    @model_validator(mode="after")
    def _env_known(self) -> TaskSection:
        from envs.base import env_options  # imports the environment (a user's module) to validate its options

        options = env_options(self.env, self.env_args)
        filled = {} if options is None else options.model_dump(mode="json")
        if filled != self.env_args:
            self.env_args = filled
        return self


class WarmupSection(_Section):
    steps: int = Field(
        2500,
        ge=0,
        description="Supervised warm-up optimizer steps before RL; 0 passes the init checkpoint through "
        "unchanged (e.g. your own model.path, already able to answer).",
    )
    batch_size: int = Field(64, ge=1, description="Warm-up batch size (sequences).")
    lr: float = Field(2e-3, gt=0, le=1.0, description="Warm-up learning rate.")
    examples: int = Field(
        10_000,
        ge=1,
        description="Distinct training problems seen in warm-up.",
    )
    teacher_error_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of warm-up demonstrations given with the flawed teacher's answer (off by one) "
        "instead of the true one: imitation learns the teacher's mistakes, RL against the verifier has to "
        "unlearn them.",
    )


class RolloutSection(_Section, SamplingFields, RolloutDeviceFields):
    engine: Literal["vllm", "hf", "auto"] = Field(
        "vllm",
        description="Rollout engine: vLLM, the HF transformers engine, or auto: chosen for this machine and "
        "policy (vLLM on a GPU or with rollout servers; on the CPU HF up to 30M parameters, measured faster "
        "there; rl_core.models.engine_choice.choose_engine). The choice is recorded in the run's placement "
        "and in each generate manifest.",
    )
    prompts_per_iteration: int = Field(64, ge=1, description="Prompts sampled per iteration.")
    n: int = Field(8, ge=1, le=256, description="Completions per prompt (the GRPO group size).")
    max_tokens: int = Field(8, ge=1, description="Maximum completion tokens.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Engine dtype. auto: the trainer's (train.dtype: fp32 -> float32, bf16 -> bfloat16); "
        "float32 keeps logprobs closest to an fp32 trainer's.",
    )
    multiprocess: bool = Field(
        False, description="vLLM engine core in a separate process (slower start on CPU)."
    )
    kv_cache_mb: int = Field(
        256, ge=16, description="KV cache size for vLLM, MiB (otherwise it reserves most of RAM)."
    )
    servers: int = Field(
        0,
        ge=0,
        le=64,
        description="Rollout engines of their own (0: the in-process engine); requests go to engine i mod N. "
        "One machine: vLLM servers the flow starts (with rollout.engine=hf, the in-process engine serves "
        "the N shards in turn); cluster.ray_address: N Ray actors holding the run's engine (vLLM or HF). "
        "On a GPU machine each takes an equal share of rollout.gpus (tensor parallel over it).",
    )
    server_urls: list[str] = Field(
        [], description="Running vLLM rollout servers to use instead (e.g. pods); overrides servers."
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=8,
        description=(
            "Asynchronous RL: iteration k samples from the policy of iteration k-1-K (a fixed schedule), so "
            "its generate, execute_envs and score_rewards run while iteration k-1 trains. 0 = synchronous."
        ),
    )
    # The curriculum (rl_core/generation/curriculum.py): which training tasks generate draws.
    curriculum: Literal["none", "frontier"] = Field(
        "none",
        description="How generate draws its prompts: none = uniformly (a derived seed); frontier = weighted "
        "by each task's estimated chance that its next group of n has a learning signal (not all solved, not "
        "all failed), from the curriculum stage's state of the previous iteration.",
    )
    curriculum_cooldown: int = Field(
        4,
        ge=0,
        le=1000,
        description="frontier: iterations a task whose last group had no learning signal stays out of the "
        "pool (weight 0); afterwards it is drawn like an unseen task of its kind.",
    )
    curriculum_window: int = Field(
        4,
        ge=1,
        le=1000,
        description="frontier: the prior of an unseen task is the share of groups with a learning signal "
        "among the tasks of its kind last seen in the previous this-many iterations.",
    )
    curriculum_keys: list[str] = Field(
        [],
        max_length=8,
        description="frontier: task fields that define a task's kind for the prior (arithmetic: op, digits); "
        "empty = one kind, all tasks.",
    )


class RewardSection(_Section):
    weights: dict[str, float] = Field(
        {"correct": 1.0, "format": 0.1},
        min_length=1,
        description="Reward functions and their weights: a built-in name (correct, format, partial), "
        "'module:function', or a name an installed package declares under 'rlfoundry.rewards'. The reward "
        "is the weighted sum of the components that did not abstain.",
    )
    model: RewardModelSettings = Field(
        default_factory=RewardModelSettings, description="The served reward model (weights key reward_model)."
    )
    judge: JudgeSettings = Field(
        default_factory=JudgeSettings, description="The LLM judge (weights key judge)."
    )
    audit: AuditSettings = Field(default_factory=AuditSettings, description="The audit of every reward.")

    @model_validator(mode="before")
    @classmethod
    def _weights_moved(cls, data: Any) -> Any:
        old = ("correct", "format", "partial")
        moved = {f"{k}_weight": f"reward.weights.{k}" for k in old} | {"advantage": "train.algorithm"}
        return _moved(data, "reward", moved)

    @model_validator(mode="after")
    def _rewards_known(self) -> RewardSection:
        check_reward_names(self.weights)
        if "reward_model" in self.weights and not self.model.path:
            raise ValueError("reward.weights has reward_model: set reward.model.path (reward-model train)")
        if "judge" in self.weights and not self.judge.model:
            raise ValueError("reward.weights has judge: set reward.judge.model (judge train)")
        return self


class TrainSection(_Section, PolicyGradientFields, TrainLayoutFields, TrainDeviceFields):
    backend: Literal["deepspeed", "torch"] = Field(
        "deepspeed", description="Train engine: DeepSpeed or plain torch."
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    lr: float = Field(1e-4, gt=0, le=1.0, description="Policy learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    micro_batch_size: int = Field(64, ge=1, description="Sequences per optimizer mini-batch.")
    epochs: int = Field(1, ge=1, le=16, description="Passes over each iteration's rollouts.")
    grad_clip: float = Field(1.0, gt=0.0, description="Gradient norm clip.")
    old_logprobs: Literal["engine", "recompute"] = Field(
        "engine",
        description=(
            "The PPO anchor: the rollout engine's sampling logprobs (no extra forward pass) or a recompute "
            "by the trainer before the first step (needed by an off-policy correction)."
        ),
    )
    correction: Literal["none", "tis", "mis"] = Field(
        "none",
        description=(
            "Off-policy correction for the gap between the recomputed anchor and the engine's behaviour "
            "logprobs: tis = truncated importance weights min(w, is_cap); mis = tokens with w outside "
            "[1/is_cap, is_cap] weighted 0 (still counted in the mean). Needs old_logprobs: recompute."
        ),
    )
    is_cap: float = Field(2.0, gt=1.0, description="Truncation / masking threshold of the correction.")
    mismatch_alarm: float = Field(
        0.05,
        gt=0.0,
        description="Alarm (a warning and the metric mismatch_alarm=1) when the mean per-token |rollout - "
        "trainer| logprob gap exceeds this.",
    )
    checkpoint_every: int = Field(
        1,
        ge=1,
        le=1000,
        description="Write the full checkpoint (weights and optimizer state) every N iterations and at the "
        "last one. The iterations between still commit rollouts, rewards, metrics and manifests; their "
        "weights stay in memory and are rebuilt bit for bit by re-running their train stages from the last "
        "written checkpoint (resume and replay do this).",
    )

    @model_validator(mode="after")
    def _correction_needs_anchor(self) -> TrainSection:
        if self.correction != "none" and self.old_logprobs != "recompute":
            raise ValueError(
                f"train.correction={self.correction} weighs the recomputed anchor against the engine's "
                "logprobs: set train.old_logprobs=recompute"
            )
        return self


class StoreSection(_Section, StorePlacementFields):
    uri: str = Field(
        "", description="Artifact store root: a path, file:// or s3:// URL. Empty = <state dir>/store."
    )
    retries: int = Field(
        6, ge=1, le=100, description="Attempts per S3 call while it is unreachable, then fail."
    )
    retry_max_wait_s: float = Field(
        20.0, gt=0, description="Longest pause between S3 retries (from 0.5 s, x2)."
    )


class TrackingSection(_Section, TrackingPlacementFields):
    mlflow_uri: str = Field("", description="MLflow tracking URI. Empty = sqlite:///<state dir>/mlflow.db.")
    enabled: bool = Field(True, description="Log lineage to MLflow.")


class Config(_Section, NoCredentials):
    """A whole experiment."""

    experiment: ExperimentSection = Field(
        default_factory=ExperimentSection, description="Run identity and length."
    )
    model: ModelSection = Field(default_factory=ModelSection, description="Policy shape and tokenizer.")
    task: TaskSection = Field(default_factory=TaskSection, description="Environment and task data.")
    warmup: WarmupSection = Field(default_factory=WarmupSection, description="Supervised warm-up stage.")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Generation stage.")
    reward: RewardSection = Field(default_factory=RewardSection, description="Reward and advantage stage.")
    train: TrainSection = Field(default_factory=TrainSection, description="Policy optimisation stage.")
    eval: EvalSection = Field(default_factory=EvalSection, description="Evaluation stage.")
    store: StoreSection = Field(default_factory=StoreSection, description="Artifact store.")
    tracking: TrackingSection = Field(default_factory=TrackingSection, description="Lineage tracking.")
    cluster: ClusterSection = Field(default_factory=ClusterSection, description="Beyond one machine (Ray).")
    alarms: AlarmsSection = Field(
        default_factory=AlarmsSection, description="Vital-sign alarms checked after every iteration."
    )


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.field=value`` strings to a config dict in place; unknown fields are refused."""
    for key, value in parse_overrides(overrides):
        set_dotted(Config, data, key, value)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults), apply ``--set`` overrides, validate everything."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        data = read_yaml(path)
    apply_overrides(data, overrides or [])
    return config_from_dict(data, source)


def config_from_dict(data: dict[str, Any], source: str = "dict") -> Config:
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None
    if cfg.model.hidden_size % cfg.model.num_heads:
        raise ConfigError(f"invalid config ({source}):\n  model.num_heads: must divide model.hidden_size")
    if cfg.eval.samples < max(cfg.eval.pass_k):
        raise ConfigError(f"invalid config ({source}):\n  eval.samples: must be >= max(eval.pass_k)")
    if (cfg.train.overlong_cache or 0) >= cfg.rollout.max_tokens:
        raise ConfigError(f"invalid config ({source}):\n  train.overlong_cache: must be < rollout.max_tokens")
    return cfg


def config_hash(cfg: Config | dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a config (or a part of one)."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
