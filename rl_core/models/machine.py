"""What a machine has that placement decides from (rl_core.models.placement): its GPUs (name, memory, compute
capability, bf16 peak), whether its CPU computes bf16 natively and whether flash-attn is installed; and the
GPUs known by name, to plan for a machine without having it.

    Machine.this()                     # probed: torch.cuda, the CPU's ISA, flash_attn importable
    Machine.described("H200", 8)       # eight H200s, as a plan for a cluster node
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rl_core.schema.overrides import ConfigError

GIB = float(1 << 30)


class PlacementError(ConfigError):
    """The config cannot run on this machine (or the machine planned for): raised before any work."""


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    capability: tuple[int, int]
    bf16_tflops: float  # dense peak of its tensor cores (0: not known); the MFU's denominator

    @property
    def bf16(self) -> bool:
        return self.capability >= (8, 0)


# Known GPUs, for planning ahead (``Machine.described``) and for the bf16 peak of a machine's own GPU
# (matched by name). Memory as the driver reports it (GiB), dense bf16 tensor TFLOP/s from the data sheets.
KNOWN_GPUS: dict[str, GPU] = {
    "H200": GPU("NVIDIA H200", 139.8, (9, 0), 989.0),
    "H100": GPU("NVIDIA H100 80GB HBM3", 79.6, (9, 0), 989.0),
    "A100-80GB": GPU("NVIDIA A100-SXM4-80GB", 79.3, (8, 0), 312.0),
    "A100-40GB": GPU("NVIDIA A100-SXM4-40GB", 39.4, (8, 0), 312.0),
    "L40S": GPU("NVIDIA L40S", 44.4, (8, 9), 362.0),
    "V100": GPU("Tesla V100-SXM2-32GB", 31.7, (7, 0), 0.0),
}


def peak_tflops(name: str) -> float:
    """The dense bf16 peak of a GPU named as the driver names it (0 when not known).

    >>> peak_tflops("NVIDIA H200"), peak_tflops("NVIDIA A100-SXM4-80GB"), peak_tflops("Radeon")
    (989.0, 312.0, 0.0)
    """
    for gpu in KNOWN_GPUS.values():
        if gpu.name == name:
            return gpu.bf16_tflops
    return next((g.bf16_tflops for k, g in KNOWN_GPUS.items() if k.split("-")[0] in name), 0.0)


@dataclass(frozen=True)
class Machine:
    """What the planner needs to know of a machine."""

    gpus: tuple[GPU, ...] = ()
    cpu_bf16: bool = False  # AVX512-BF16 or AMX: torch's CPU kernels compute bf16 natively
    flash_attn: bool = False  # the flash-attn package (2.x) is importable
    cpu_threads: int = 1  # torch's CPU threads in this process (its intra-op pool: the cores it may use)

    @classmethod
    def this(cls) -> Machine:
        import torch

        gpus = []
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            p = torch.cuda.get_device_properties(i)
            gpus.append(GPU(p.name, p.total_memory / GIB, (p.major, p.minor), peak_tflops(p.name)))
        cpu = getattr(torch, "cpu", None)
        cpu_bf16 = any(
            bool(getattr(cpu, probe, lambda: False)())
            for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        )
        flash = importlib.util.find_spec("flash_attn") is not None
        return cls(tuple(gpus), cpu_bf16, flash, torch.get_num_threads())

    @classmethod
    def described(cls, gpu: str, count: int = 1, *, flash_attn: bool = True) -> Machine:
        """A machine of ``count`` GPUs of a known kind (``KNOWN_GPUS``), to plan for one without it."""
        if gpu not in KNOWN_GPUS:
            raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(KNOWN_GPUS)}")
        return cls((KNOWN_GPUS[gpu],) * count, cpu_bf16=True, flash_attn=flash_attn)

    def describe(self) -> dict[str, Any]:
        return {
            "gpus": [{"name": g.name, "memory_gib": round(g.memory_gib, 1)} for g in self.gpus],
            "cpu_bf16": self.cpu_bf16,
            "flash_attn": self.flash_attn,
            "cpu_threads": self.cpu_threads,
        }


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Torch's CPU threads in this thread only (OpenMP's thread count is per calling thread), ``n`` while
    the block runs, then as before; None: as they are."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
