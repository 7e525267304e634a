"""What a sandbox run is given and may use: the ``Limits`` of one run, the two modes, the refusal error.

No mechanism lives here, so this module covers no threat by itself: ``cgroup.py``, ``fresh.py`` and
``zygote.py`` enforce these numbers (rlimits, cgroup limits, the wall-clock timeout, the tmpfs size).

    from envs.sandbox import Limits
    Limits(timeout_s=5, memory_mb=256)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

Mode = Literal["strict", "rlimits"]
MODE_ENV = "RLFOUNDRY_SANDBOX_MODE"
# How to accept the weaker mode, named in every refusal that suggests it.
WEAKER_MODE_HINT = (
    f'Sandbox(mode="rlimits"), `rlfoundry sandbox exec --mode rlimits`, or {MODE_ENV}=rlimits '
    "for the environments"
)


class SandboxUnavailable(RuntimeError):
    """A mechanism the sandbox needs is missing here; the message says which and what to do."""


def configured_mode() -> Mode:
    """The mode environments use: ``$RLFOUNDRY_SANDBOX_MODE`` (strict unless it names the weaker one)."""
    mode = os.environ.get(MODE_ENV, "strict")
    if mode not in ("strict", "rlimits"):
        raise SandboxUnavailable(f"{MODE_ENV}={mode!r}: must be strict or rlimits")
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_s: float | None = None  # default: the timeout
    max_procs: int = 32
    disk_mb: int = 64
    output_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_procs", "disk_mb", "output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")

    @property
    def cpu_seconds(self) -> int:
        """The RLIMIT_CPU soft limit: ``cpu_s`` (default: the timeout), rounded up, at least 1."""
        import math

        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s))
