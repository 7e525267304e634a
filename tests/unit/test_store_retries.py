"""Retries against an unreachable object store stop at a total time, not only after N attempts: an
endpoint that accepts connections and never answers costs a read timeout per attempt."""

from __future__ import annotations

import time

import pytest

from rl_core.artifacts.retries import StoreUnavailable, with_retries


def test_no_retry_starts_past_the_total_time():
    calls = []

    def hangs_then_times_out() -> None:
        calls.append(time.monotonic())
        time.sleep(0.2)  # a read timeout, in small
        raise TimeoutError("read timed out")

    with pytest.raises(StoreUnavailable, match=r"read manifest failed 2 times \(TimeoutError"):
        with_retries(hangs_then_times_out, what="read manifest", attempts=6, max_wait_s=0.01, max_total_s=0.3)
    assert len(calls) == 2  # six attempts were allowed; the second ended past the total time


def test_attempts_still_bound_quick_failures():
    calls = []

    def refused() -> None:
        calls.append(1)
        raise ConnectionError("connection refused")

    with pytest.raises(StoreUnavailable, match="failed 3 times"):
        with_retries(refused, what="list runs", attempts=3, max_wait_s=0.01, max_total_s=60)
    assert len(calls) == 3


def test_other_errors_pass_through_at_once():
    calls = []

    def bad() -> None:
        calls.append(1)
        raise KeyError("not transient")

    with pytest.raises(KeyError):
        with_retries(bad, what="x", attempts=6, max_wait_s=0.01)
    assert calls == [1]
