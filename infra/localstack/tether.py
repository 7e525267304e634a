"""Run a server for as long as the process that started it lives (``spawn(..., tie_to_parent=True)``).

    python infra/localstack/tether.py PARENT_PID PARENT_CREATE_TIME -- COMMAND...

Starts COMMAND in this process group (``spawn`` made it a new session) and waits for it, checking twice a
second that the parent (pid and create time, so a reused pid does not count) still runs. When the parent is
gone, however it died, COMMAND gets SIGTERM, then SIGKILL with the rest of the group after 5 s. Exits with
COMMAND's exit status. A SIGTERM or SIGINT sent to this process alone is passed on to COMMAND.

Run as a file, not a module, so it needs nothing but psutil on the path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil


def _parent(pid: int, created: float) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - created) <= 0.01 else None
    except psutil.Error:
        return None


def _lives(p: psutil.Process | None) -> bool:
    try:
        return p is not None and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write(__doc__ or "")
        return 2
    parent = _parent(int(argv[1]), float(argv[2]))
    child = subprocess.Popen(argv[4:])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while _lives(parent):
        try:
            code = child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
        return code if code >= 0 else 128 - code
    child.terminate()
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
