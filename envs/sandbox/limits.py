"""What a sandbox run is given and may use: the ``Limits`` of one run, the two modes, the refusal error.

No mechanism lives here, so this module covers no threat by itself: ``cgroup.py``, ``fresh.py`` and
``zygote.py`` enforce these numbers (rlimits, cgroup limits, the wall-clock timeout, the tmpfs size).

    from envs.sandbox import Limits
    Limits(timeout_s=5, memory_mb=256)
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Literal

Mode = Literal["strict", "rlimits"]
# The longest time limit a run may be given (a week): beyond it a number bounds nothing in practice, and
# RLIMIT_CPU's rounded seconds must still fit the kernel's rlim_t.
MAX_SECONDS = 7 * 24 * 3600.0
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
        # A limit that cannot bound anything (inf, NaN: NaN <= 0 is False) or is not a number is refused
        # here, by name, for library callers as for the CLI; a bool is not a count.
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "disk_mb", "output_bytes"):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            counted = name not in ("timeout_s", "cpu_s")
            kinds = numbers.Integral if counted else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kinds):
                kind = "an integer" if counted else "a number"
                raise ValueError(f"sandbox limit {name} must be {kind}, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"sandbox limit {name} must be finite and > 0, got {value!r}")
            if not counted and value > MAX_SECONDS:
                raise ValueError(f"sandbox limit {name} must be <= {MAX_SECONDS:.0f} s, got {value!r}")

    @property
    def cpu_seconds(self) -> int:
        """The RLIMIT_CPU soft limit: ``cpu_s`` (default: the timeout), rounded up, at least 1."""
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s))
