"""A launched train rank ends without the interpreter's teardown (rl_core.training.train_launch.end_rank): the
teardown is where a native library's destructor aborted a finished rank (gloo's threads: "terminate called
without an active exception", rank 1 killed by SIGABRT after the job's work, CI of stop 48). The stand-in for
that destructor here is an exit handler that aborts the process: it must never run."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from rl_core.artifacts.paths import PROJECT_ROOT

SCRIPT = """
import atexit, logging, os, sys
from rl_core.training.train_launch import end_rank
atexit.register(os.abort)  # what a native library's destructor at exit does to the process
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

def work():
    print("written", flush=False)          # buffered: must still reach the log
    logging.getLogger("rank").info("logged")
    if sys.argv[1] == "raise":
        raise ValueError("the update failed")
    if sys.argv[1] == "exit3":
        raise SystemExit(3)

end_rank(work)
print("never reached")
"""


@pytest.mark.parametrize(("mode", "code"), [("ok", 0), ("raise", 1), ("exit3", 3)])
def test_a_rank_ends_with_its_own_code_and_output_not_the_teardowns(mode: str, code: int):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != -signal.SIGABRT, done.stderr  # the exit handler (the native abort) never ran
    assert done.returncode == code, done.stderr
    assert done.stdout == "written\n"  # flushed, and nothing after the rank's end ran
    assert "logged" in done.stderr
    assert ("ValueError: the update failed" in done.stderr) == (mode == "raise")


def _summary(*entries: tuple[int, int, str]) -> str:
    """torchrun's failure summary as it ends a job's log: the other failures, then the first observed."""

    def entry(rank: int, code: int, sig: str) -> str:
        return f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 9{rank}) {sig}\n"

    *others, root = entries
    listed = "".join(f"[{i + 1}]:\n{entry(*e)}" for i, e in enumerate(others)) or "  <NO_OTHER_FAILURES>\n"
    return (
        "Traceback (most recent call last):\n  File x\nRuntimeError: rank : 7 (local_rank: 7) exitcode : 3\n"
        f"rl_core.training.train_launch FAILED\nFailures:\n{listed}"
        f"Root Cause (first observed failure):\n[0]:\n{entry(*root)}"
    )


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        # the killed rank's peer raised in its collective and exited first: the kill is the cause
        ([(1, -9, "(SIGKILL)"), (0, 1, "")], (1, -9)),
        # torchrun's SIGTERM of the peer is its own doing, never the cause
        ([(0, -15, "(SIGTERM)"), (1, -6, "(SIGABRT)")], (1, -6)),
        ([(1, -15, "(SIGTERM)"), (0, 1, "")], (0, 1)),
        ([(0, 2, "")], (0, 2)),
    ],
)
def test_the_failure_named_is_the_rank_that_caused_it(tmp_path, entries, want):
    from rl_core.training.train_launch import _aborted, _failure, culprit

    text = _summary(*entries)
    assert culprit(text) == want  # not the RuntimeError's text before the summary
    log = tmp_path / "train.log"
    log.write_text(text)
    rank, code = want
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    assert f"rank {rank} of 2 {'was ' if code < 0 else ''}{how}" in str(_failure(log, 3, 2, 1))
    assert _aborted(log) == (code == -signal.SIGABRT)


def test_a_log_without_a_summary_names_the_jobs_exit_code(tmp_path):
    from rl_core.training.train_launch import _aborted, _failure, culprit

    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\nOSError: port in use\n")
    assert culprit(log.read_text()) is None and not _aborted(log)
    assert "the job of 2 processes exited with code 1" in str(_failure(log, 3, 2, 1))


@pytest.mark.slow  # a torchrun agent and its rank: ~5 s
def test_the_torchrun_agent_leaves_no_folder_behind(tmp_path):
    """torchrun makes a ``torchelastic_*`` folder in the temp folder for every job and never removes it (the
    suite left ~100 in /tmp a run): the agent's folder is a temporary one of the job's (``_job``)."""
    import os

    from rl_core.training.train_launch import _job, agent_command

    temp = tmp_path / "temp"
    temp.mkdir()
    script = tmp_path / "rank.py"
    script.write_text("import os; print('error file', os.environ['TORCHELASTIC_ERROR_FILE'], flush=True)\n")
    given: list[str] = []

    def command(own: str) -> list[str]:  # the train stage's agent, one rank running the script
        given.append(own)
        return [*agent_command(1, own), str(script)]

    log = tmp_path / "job.log"
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(PROJECT_ROOT)}
    assert _job(command, env, log) == 0, log.read_text()
    (own,) = given
    assert f"error file {own}/" in log.read_text()  # the rank's files were in the job's folder...
    assert not os.path.exists(own) and list(temp.iterdir()) == []  # ...which went, and nothing else stayed
