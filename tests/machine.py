"""Which machine a pinned number belongs to: the CPU and the instruction sets its float kernels dispatch on.

Float results of the CPU kernels (oneDNN / MKL matmuls, ATen's vectorised ops) differ in their last bits
between CPU models and ISA levels, so a policy sha256 recorded on one machine holds only there. A test that
pins such a number compares it where ``fingerprint()`` equals the recorded one, and everywhere asserts what
holds on any machine (two runs give the same hashes; resume and replay reproduce them).

    python -m tests.machine      # this machine's fingerprint, as JSON
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

# The flags that change which kernels torch runs (ATen's CPU capability, oneDNN's and MKL's ISA choice).
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if info:
                break  # the first processor's block is enough
            continue
        info.setdefault(key.strip(), value.strip())
    return info


def fingerprint() -> dict[str, object]:
    """The CPU (vendor, model name and numbers), the kernel-relevant ISA flags, torch's dispatch level and
    version."""
    import torch

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "arch": platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "model": info.get("model name", ""),
        # a virtual machine may name every generation "AMD EPYC": the family/model numbers tell them apart
        "family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
        "isa": [f for f in KERNEL_FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def pinned(name: str) -> dict:
    """The record ``tests/pinned/NAME.json``: {"machine": fingerprint, ...the pinned values}."""
    return json.loads((Path(__file__).parent / "pinned" / f"{name}.json").read_text())


def same_machine(record: dict) -> bool:
    return record["machine"] == fingerprint()


if __name__ == "__main__":
    print(json.dumps(fingerprint(), indent=1))
