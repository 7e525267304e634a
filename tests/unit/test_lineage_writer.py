"""Lineage writes in submission order, on the writer's thread or inline (``tracking.writes``), and a failed
write is not lost."""

from __future__ import annotations

import threading

import pytest

from rl_core.run.context import legacy_config_hash, run_config_hash
from rl_core.run.lineage import LineageWriter, writes_inline
from rl_core.schema.config import Config


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


def test_inline_writes_run_in_the_submitting_thread_in_order_and_hold_their_failure():
    w, seen = LineageWriter(inline=True), []
    w.submit(1, lambda: seen.append(threading.current_thread().name))

    def boom() -> None:
        raise ConnectionError("MLflow: database is locked")

    failed = w.submit(2, boom)
    w.submit(3, lambda: seen.append("after"))
    assert seen == [threading.current_thread().name, "after"]  # done at submit, by the caller
    assert isinstance(failed.exception(), ConnectionError)
    w.flush(upto=1)
    with pytest.raises(ConnectionError, match="database is locked"):
        w.flush(upto=2)  # raised where the thread's failure would be
    w.flush()


@pytest.mark.parametrize(
    ("given", "inline"),
    [
        ({}, True),  # MLflow on SQLite under the state dir, the store a local folder
        ({"tracking": {"mlflow_uri": "sqlite:////tmp/m.db"}, "store": {"uri": "/data/store"}}, True),
        ({"tracking": {"mlflow_uri": "file:///tmp/mlruns"}}, True),
        ({"tracking": {"mlflow_uri": "http://127.0.0.1:5000"}}, False),  # waits on a socket
        ({"tracking": {"mlflow_uri": "postgresql://mlflow@db/mlflow"}}, False),
        ({"store": {"uri": "s3://bucket/runs"}}, False),  # MLflow's artifacts go beside the store
        ({"store": {"uri": "s3://bucket/runs"}, "tracking": {"writes": "inline"}}, True),
        ({"tracking": {"writes": "background"}}, False),
    ],
)
def test_where_the_writes_go(given: dict, inline: bool) -> None:
    assert writes_inline(Config.model_validate(given)) is inline


def test_the_write_mode_is_not_part_of_the_runs_hash() -> None:
    """How lineage is written changes no stage's output: a run resumes with another mode."""
    a, b = Config(), Config.model_validate({"tracking": {"writes": "background"}})
    assert run_config_hash(a) == run_config_hash(b)
    assert legacy_config_hash(a) == legacy_config_hash(b)
