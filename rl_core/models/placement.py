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

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rl_core.models.engine_choice import AUTO_HF_MAX_PARAMS, choose_engine
from rl_core.models.machine import GPU, KNOWN_GPUS, Machine, PlacementError, peak_tflops
from rl_core.models.memory_plan import DTYPES, Shape, memory_plan, model_shape, trainer_terms
from rl_core.models.vllm_args import cpu_vllm_args

__all__ = [
    "AUTO_HF_MAX_PARAMS",
    "GPU",
    "KNOWN_GPUS",
    "Machine",
    "PlacementError",
    "Placement",
    "Shape",
    "Workload",
    "choose_engine",
    "model_shape",
    "peak_tflops",
    "plan",
    "trainer_terms",
]


@dataclass(frozen=True)
class Workload:
    device: str  # "cpu" or "cuda:<index>"
    dtype: str  # "float32" or "bfloat16": weights held and forwards computed in it
    attn: str  # transformers' attn_implementation: "sdpa", "eager", "flash_attention_2" or "flex_attention"

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class Placement:
    workloads: dict[str, Workload]
    trainer_gpus: tuple[int, ...] = ()
    rollout_gpus: tuple[int, ...] = ()
    colocated: bool = False  # the engine shares a trainer GPU and sleeps while the trainer steps
    vllm: dict[str, Any] = field(default_factory=dict)  # the engine's device-dependent LLM(...) arguments
    memory: dict[str, Any] | None = None  # per GPU and phase, GiB (None on CPU)
    machine: dict[str, Any] = field(default_factory=dict)
    # rollout.servers on a GPU machine: each server's GPUs (its CUDA_VISIBLE_DEVICES; () on CPU)
    server_gpus: tuple[tuple[int, ...], ...] = ()
    judge_vllm: dict[str, Any] = field(default_factory=dict)  # the LLM judge's engine's ({} on CPU)
    reward_vllm: dict[str, Any] = field(default_factory=dict)  # the reward server's ({} on CPU)
    # torch's CPU threads per iteration stage ("*": the other iteration stages); {}: torch's own count
    threads: dict[str, int] = field(default_factory=dict)
    rollout_engine: str = "vllm"  # rollout.engine with auto resolved (``choose_engine``)
    engine_reason: str = "rollout.engine"  # why: the setting, or the rule auto applied

    @property
    def engine_processes(self) -> bool:
        """The in-process engine must run its engine core in a process of its own: on GPUs that are not this
        process's first ones (CUDA_VISIBLE_DEVICES can only be given to a new process) or tensor parallel."""
        return bool(self.rollout_gpus) and (
            self.rollout_gpus != tuple(range(len(self.rollout_gpus))) or len(self.rollout_gpus) > 1
        )

    def judge_engine(self) -> Placement | None:
        """The placement the LLM judge's engine starts with: on a GPU machine the rollout engine's first GPU,
        its dtype and ``judge_vllm`` (sleeping beside a colocated trainer like the policy's engine); None
        on the CPU, where the judge's engine gets the CPU arguments at its own context length."""
        if not self.judge_vllm:
            return None
        judge = self.workloads["judge"]
        return replace(
            self,
            workloads={**self.workloads, "rollout": judge, "hf_engine": judge},
            rollout_gpus=self.rollout_gpus[:1],
            vllm=self.judge_vllm,
        )

    def as_dict(self) -> dict[str, Any]:
        """What the run's record keeps (rl_core.run.runs): where each workload ran and the memory plan."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        """The placement ``as_dict`` wrote (read back from JSON: lists where tuples were)."""
        fields = dict(data)
        fields["workloads"] = {k: Workload(**w) for k, w in data["workloads"].items()}
        for key in ("trainer_gpus", "rollout_gpus"):
            fields[key] = tuple(data.get(key, ()))
        fields["server_gpus"] = tuple(tuple(g) for g in data.get("server_gpus", ()))
        return cls(**fields)

    def for_rank(self, local_rank: int) -> Placement:
        """The placement a launched trainer rank works with: the flow's, its trainer-side workloads on its own
        GPU, ``cuda:LOCAL_RANK`` of the trainer GPUs the launcher made visible (on every node alike). A rank
        never plans again: the GPUs it sees are not the machine's.

        >>> gpu = Placement({"trainer": Workload("cuda:2", "bfloat16", "sdpa")}, trainer_gpus=(2, 3))
        >>> gpu.for_rank(1).workloads["trainer"].device, Placement({"trainer": Workload("cpu", "float32",
        ...     "sdpa")}).for_rank(1).workloads["trainer"].device
        ('cuda:1', 'cpu')
        """
        if not self.trainer_gpus:
            return self
        own = {
            name: replace(w, device=f"cuda:{local_rank}") if name in TRAINER_SIDE else w
            for name, w in self.workloads.items()
        }
        return replace(self, workloads=own)

    def for_engine_actor(self) -> Placement:
        """The placement a rollout engine in a Ray actor starts with (``rl_core.generation.ray_engines``): the
        flow's, its engine on the first of the GPUs Ray gave the actor (the only ones it sees: ``cuda:0``).

        >>> gpu = Placement({"rollout": Workload("cuda:3", "bfloat16", "sdpa")}, rollout_gpus=(3,),
        ...                 server_gpus=((3,), (4,)))
        >>> gpu.for_engine_actor().workloads["rollout"].device, gpu.for_engine_actor().rollout_gpus
        ('cuda:0', (0,))
        """
        if not self.server_gpus:
            return self
        own = {
            name: replace(w, device="cuda:0") if name in ("rollout", "hf_engine") else w
            for name, w in self.workloads.items()
        }
        return replace(self, workloads=own, rollout_gpus=tuple(range(len(self.server_gpus[0]))))


# The workloads that live in the trainer's ranks (a launched rank runs them on its own GPU).
TRAINER_SIDE = ("trainer", "reference", "critic")


def _attn(cfg: Any, on_gpu: bool, dtype: str, machine: Machine, engine: bool = False) -> str:
    """The attention kernel (``train.attn``, auto resolved) of the trainer and reference, or with ``engine``
    of the HF engine (which decodes with a KV cache: flex_attention's per-shape compile would not pay)."""
    kernel = cfg.train.attn
    if kernel == "flash_attention_2" and not (on_gpu and machine.flash_attn):
        raise PlacementError(
            "train.attn=flash_attention_2 needs a GPU and the flash-attn package "
            "(pip install flash-attn --no-build-isolation); use train.attn=auto"
        )
    if kernel == "flex_attention" and not on_gpu:
        raise PlacementError("train.attn=flex_attention needs a GPU (flex_attention has no CPU backward)")
    if kernel == "auto":
        if on_gpu and machine.flash_attn and dtype == "bfloat16":
            kernel = "flash_attention_2"
        else:  # packed rows on a GPU: a document mask that is never dense
            kernel = "flex_attention" if on_gpu and cfg.train.packing else "sdpa"
    return "sdpa" if engine and kernel == "flex_attention" else kernel


def engine_dtype(cfg: Any) -> str:
    """The rollout engine's dtype: rollout.dtype, or with ``auto`` the trainer's.

    >>> from rl_core.schema.config import Config
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


def _gpus(cfg: Any, machine: Machine, rollout_engine: str) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
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
    colocated = not engine and rollout_engine == "vllm"
    if colocated and cfg.rollout.max_staleness > 0:
        raise PlacementError(
            f"rollout.max_staleness={cfg.rollout.max_staleness} generates while the trainer steps, but a "
            "colocated engine (rollout.gpus=[]) sleeps then: give the engine its own rollout.gpus"
        )
    return trainer, (engine or trainer[:1]), colocated


# The stages an asynchronous run's thread pool runs beside train (flows/iteration.py: ROLLOUT_STAGES).
ROLLOUT_SIDE = ("generate", "execute_envs", "audit", "score_rewards")


def stage_threads(cfg: Any, on_gpu: bool, machine: Machine) -> dict[str, int]:
    """The CPU threads of each iteration stage: where the asynchronous schedule runs the rollout stages beside
    train on a CPU machine, the cores are split between the two sides instead of both taking all of them
    (oversubscribed, each side's OpenMP threads wait on the other's: benchmarks/vs_trl.py measured that
    schedule slower than the synchronous one). Every iteration stage then gets its count explicitly, in the
    flow and in a replay alike, so a stage's numbers never depend on which thread ran it. {} (torch's own
    count) on a GPU machine, synchronously, with rollout servers, and on one core.

    >>> from rl_core.schema.config import Config
    >>> cfg = Config.model_validate({"rollout": {"max_staleness": 1}})
    >>> two = Machine(cpu_threads=2)
    >>> stage_threads(cfg, False, two)["generate"], stage_threads(cfg, False, two)["*"]
    (1, 1)
    >>> stage_threads(Config(), False, two), stage_threads(cfg, True, two)
    ({}, {})
    """
    r = cfg.rollout
    if on_gpu or not r.max_staleness or r.servers or r.server_urls or machine.cpu_threads < 2:
        return {}
    side = machine.cpu_threads // 2
    return {**dict.fromkeys(ROLLOUT_SIDE, side), "*": machine.cpu_threads - side}


def plan(cfg: Any, machine: Machine, multimodal: bool | str | None = False) -> Placement:
    """Where and in what precision every workload of ``cfg`` runs on ``machine``, and which rollout engine
    (``multimodal``: the policy's vision-language family, ``RunContext.multimodal``); PlacementError if it
    cannot (no GPU for a GPU setting, bf16 without support, a memory plan that does not fit)."""
    shape = model_shape(cfg)
    engine, why = choose_engine(cfg, bool(machine.gpus), shape, multimodal)
    trainer_gpus, rollout_gpus, colocated = _gpus(cfg, machine, engine)
    _check_bf16(cfg, machine, trainer_gpus)
    on_gpu = bool(trainer_gpus)
    compute = DTYPES[cfg.train.dtype]
    attn = _attn(cfg, on_gpu, compute, machine)
    first = f"cuda:{trainer_gpus[0]}" if on_gpu else "cpu"
    eng_device = f"cuda:{rollout_gpus[0]}" if on_gpu else "cpu"
    eng_dtype = engine_dtype(cfg)
    engine_attn = _attn(cfg, on_gpu, eng_dtype, machine, engine=True)
    judge_attn = "vllm" if cfg.reward.judge.engine == "vllm" else engine_attn
    workloads = {
        # in the flow this GPU; a launched rank r cuda:r of the trainer GPUs it sees (Placement.for_rank)
        "trainer": Workload(first, compute, attn),
        "reference": Workload(first, compute, attn),
        "critic": Workload(first, "float32", "sdpa"),
        "warmup": Workload(first, "float32", "sdpa"),
        "rollout": Workload(eng_device, eng_dtype, "vllm" if engine == "vllm" else engine_attn),
        "hf_engine": Workload(eng_device, eng_dtype, engine_attn),
        "reward_model": Workload(first, "float32", "sdpa"),
        "judge": Workload(eng_device, eng_dtype, judge_attn),  # beside the policy's engine, in its dtype
    }
    servers = _server_gpus(cfg, rollout_gpus) if on_gpu else ()
    tp = len(servers[0]) if servers else len(rollout_gpus) if cfg.rollout.gpus else 1
    vllm = _vllm_args(cfg, on_gpu, colocated, tp)
    judge_vllm: dict[str, Any] = {}
    reward_vllm: dict[str, Any] = {}
    if on_gpu:
        share = cfg.rollout.reward_gpu_memory_utilization
        judge_vllm = {**vllm, "gpu_memory_utilization": share, "tensor_parallel_size": 1}
        # a pooling model scores whole sequences: no chunked prefill; it stays awake (another process)
        reward_vllm = {
            "enforce_eager": not cfg.rollout.cuda_graphs,
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(cfg.rollout.max_num_batched_tokens, cfg.model.max_position),
            "gpu_memory_utilization": share,
        }
    memory = None
    if on_gpu and shape is not None:
        memory = memory_plan(cfg, machine, shape, trainer_gpus, rollout_gpus, colocated, eng_dtype, engine)
    return Placement(
        workloads,
        trainer_gpus,
        rollout_gpus,
        colocated,
        vllm,
        memory,
        machine.describe(),
        server_gpus=servers,
        judge_vllm=judge_vllm,
        reward_vllm=reward_vllm,
        threads=stage_threads(cfg, on_gpu, machine),
        rollout_engine=engine,
        engine_reason=why,
    )


def _server_gpus(cfg: Any, rollout_gpus: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each of ``rollout.servers``' GPUs on a GPU machine: ``rollout.gpus`` split evenly among them (each
    server tensor parallel over its share). Servers never share the trainer's GPU: they cannot be put to
    sleep in step with the train stage from here."""
    n = cfg.rollout.servers if not cfg.rollout.server_urls else 0
    if not n:
        return ()
    gpus = list(cfg.rollout.gpus)
    if not gpus or len(gpus) % n:
        raise PlacementError(
            f"rollout.servers={n} on a GPU machine needs rollout.gpus listing a multiple of {n} GPUs of "
            f"their own (each server takes an equal share, tensor parallel over it), got rollout.gpus={gpus}"
        )
    per = len(gpus) // n
    return tuple(tuple(rollout_gpus[i * per : (i + 1) * per]) for i in range(n))


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
