"""A sandbox run's ``Limits`` refuse numbers that bound nothing, for library callers as for the CLI."""

from __future__ import annotations

import math

import pytest

from envs.sandbox.limits import MAX_SECONDS, Limits


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("timeout_s", math.inf, "timeout_s must be finite"),
        ("timeout_s", math.nan, "timeout_s must be finite"),
        ("timeout_s", 0, "timeout_s must be finite and > 0"),
        ("timeout_s", -1.0, "timeout_s must be finite and > 0"),
        ("timeout_s", MAX_SECONDS * 2, "timeout_s must be <="),
        ("timeout_s", "10", "timeout_s must be a number"),
        ("cpu_s", math.inf, "cpu_s must be finite"),
        ("cpu_s", 0.0, "cpu_s must be finite and > 0"),
        ("memory_mb", math.inf, "memory_mb must be an integer"),
        ("memory_mb", 256.5, "memory_mb must be an integer"),
        ("memory_mb", True, "memory_mb must be an integer"),
        ("max_procs", 0, "max_procs must be finite and > 0"),
        ("disk_mb", -4, "disk_mb must be finite and > 0"),
        ("output_bytes", None, "output_bytes must be an integer"),
    ],
)
def test_a_limit_that_bounds_nothing_is_refused_by_name(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Limits(**{field: value})


def test_finite_limits_are_kept_and_cpu_seconds_round_up() -> None:
    import numpy as np

    lim = Limits(timeout_s=2.5, memory_mb=np.int64(128), cpu_s=None, max_procs=4, disk_mb=1, output_bytes=256)
    assert (lim.timeout_s, lim.memory_mb, lim.max_procs) == (2.5, 128, 4)
    assert lim.cpu_seconds == 3
    assert Limits(timeout_s=5, cpu_s=0.2).cpu_seconds == 1
    assert Limits(timeout_s=MAX_SECONDS).cpu_seconds == int(MAX_SECONDS)
