"""The server-log check of tests/conftest.py flags what a broken background service writes, and not what a
healthy one does (lines taken from the servers' own logs)."""

from __future__ import annotations

import re

from tests.conftest import log_errors

SCHEDULER_FAILING = """\
13:01:00.113 | INFO    | prefect.server.services.scheduler - Scheduling runs
13:01:00.250 | ERROR   | prefect.server.services.scheduler - Unexpected error in: Scheduler
Traceback (most recent call last):
  File "/v/lib/python3.11/site-packages/prefect/server/services/scheduler.py", line 301, \
in _insert_scheduled_flow_runs
    await session.execute(stmt)
sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement; \
please supply a bulk_dml decorated function
13:02:00.101 | INFO    | prefect.server.services.scheduler - Scheduling runs
"""
HEALTHY = """\
13:01:00.113 | INFO    | prefect.server.services.scheduler - Scheduled 3 runs.
INFO:     127.0.0.1:50312 - "POST /api/flow_runs/filter HTTP/1.1" 200 OK
I1130 18:21:07.474 volume_grpc_client_to_master.go:43 checkConnectivity to master
W1130 18:21:07.512 filer.go:93 skipping, no peers
[2026-11-30 18:22:01 +0000] [4711] [INFO] Booting worker with pid: 4711
"""


def test_a_failing_scheduler_is_flagged_with_its_exception():
    found = log_errors(SCHEDULER_FAILING)
    assert len(found) == 1  # the logger's message and its traceback: one entry
    assert "Unexpected error in: Scheduler" in found[0].splitlines()[0]
    assert "\nTraceback" in found[0] and found[0].endswith("bulk_dml decorated function")


def test_an_allowance_matching_the_exception_covers_the_message_line():
    """CI failed on 'Encountered error during state validation': the message line of a logged exception
    whose traceback (sqlite 'database is locked', allowed in the deployment tests) was allowed alone."""
    text = (
        "12:07:14.689 | ERROR   | prefect.server - Encountered error during state validation\n"
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked\n"
        "12:07:15.000 | INFO    | prefect.server - fine\n"
    )
    allowed = re.compile("database is locked")
    assert [e for e in log_errors(text) if not allowed.search(e)] == []
    other = text.replace("database is locked", "no such table: flow_run")
    assert len([e for e in log_errors(other) if not allowed.search(e)]) == 1


def test_uvicorn_and_glog_errors_are_flagged():
    assert log_errors("ERROR:    Exception in ASGI application\nINFO: x") == [
        "ERROR:    Exception in ASGI application"
    ]
    assert log_errors("E1130 18:21:07.474 store.go:12 disk full") == [
        "E1130 18:21:07.474 store.go:12 disk full"
    ]
    assert log_errors("F1130 18:21:07.474 weed.go:1 fatal") == ["F1130 18:21:07.474 weed.go:1 fatal"]


def test_a_healthy_log_has_no_errors():
    assert log_errors(HEALTHY) == []
