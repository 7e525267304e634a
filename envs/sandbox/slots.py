"""Slots: each concurrent sandbox run of this machine gets a host uid of its own.

Covers: a run executes (outside its user namespace) as ``UID_BASE + slot``, a uid no other run and no host
process has while the slot is held (an flock on a private lock file, across every process of the machine). So
a run cannot signal, trace or read /proc of another run or of the host, and per-uid kernel limits
(RLIMIT_NPROC) count only its own processes. Only when the caller is root: otherwise every run keeps the
caller's uid and this isolation rests on the namespaces alone.

Does not cover: anything the uid does not decide (shared kernel state is the namespaces' job, resources the
cgroup's).

    slot = Slot(); try: ... popen(**slot.popen_ids()) ... finally: slot.release()
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from envs.sandbox.limits import SandboxUnavailable

UID_BASE = 61000  # outside uid of slot i is UID_BASE + i: one uid per concurrent run
SLOTS = 1024


class Slot:
    """An exclusive slot (flock on a file) across every process of this machine: its own outside uid."""

    def __init__(self) -> None:
        d = Path(tempfile.gettempdir()) / f"rlfoundry-sandbox-slots-{os.geteuid()}"
        d.mkdir(mode=0o700, exist_ok=True)
        if d.stat().st_uid != os.geteuid() or d.stat().st_mode & 0o077:
            raise SandboxUnavailable(f"{d} is not private to this user: refusing to use it for slot locks")
        start = random.randrange(SLOTS)
        for k in range(SLOTS):
            i = (start + k) % SLOTS
            fd = os.open(d / f"{i}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.index, self.fd = i, fd
            return
        raise RuntimeError(f"all {SLOTS} sandbox slots are busy")

    def release(self) -> None:
        os.close(self.fd)

    @property
    def uid(self) -> int | None:
        """The run's host uid; None when this process is not root (the run keeps the caller's uid)."""
        return UID_BASE + self.index if os.geteuid() == 0 else None

    def popen_ids(self) -> dict[str, Any]:
        """``subprocess.Popen`` arguments to start the run as the slot's uid and gid, with no extra groups."""
        uid = self.uid
        return {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}


def slot_processes() -> list[int]:
    """Live (non-zombie) processes of this machine running as any sandbox slot uid: after a run, none."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            if UID_BASE <= uid < UID_BASE + SLOTS and status.split("\nState:")[1].split()[0] != "Z":
                out.append(int(d.name))
    return out
