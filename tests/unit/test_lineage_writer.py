"""Lineage writes off the critical path: in submission order, and a failed write is not lost."""

from __future__ import annotations

import threading

import pytest

from rl_core.run.lineage import LineageWriter


def test_writes_run_in_order_and_flush_waits_only_for_what_is_due():
    w, seen, gate = LineageWriter(), [], threading.Event()
    w.submit(1, lambda: seen.append(1))
    w.submit(2, lambda: (gate.wait(10), seen.append(2)))
    w.flush(upto=1)  # does not wait for iteration 2's write, which is held back
    assert seen == [1]
    gate.set()
    w.flush()
    assert seen == [1, 2]


def test_a_failed_write_is_raised_at_the_next_flush():
    w = LineageWriter()

    def boom() -> None:
        raise ConnectionError("MLflow artifact upload for train: endpoint unreachable")

    w.submit(3, boom)
    w.flush(upto=2)  # not yet due
    with pytest.raises(ConnectionError, match="artifact upload for train"):
        w.flush(upto=3)
    w.flush()  # reported once, then gone
