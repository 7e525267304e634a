"""One process at a time runs a run: ``rlfoundry run``/``resume`` and a deployment's flow run hold the run's
lock in the store (``<run>/run.lock``, a ``StageLock``: a conditional create and a heartbeat, so it works on a
local folder, an NFS mount and S3) from before the run record is written until the flow ends.

Without it a second ``resume`` of a running run cleared the stage folder the first was committing into (a
committed manifest over an emptied folder: the run could never be resumed again). A second process is refused,
naming the holder; a holder that died is found out (on this host: its pid is gone; elsewhere: its heartbeat
stopped for ``store.lock_stale_after_s``) and its lock broken, so a crashed run resumes as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rl_core.artifacts.store_lock import LockHeld, StageLock
from rl_core.run.runs import RUN_RECORD, RunError

_HELD: dict[tuple[str, str], StageLock] = {}  # (store root, run id) -> this process's hold of its lock


class RunBusy(RunError):
    """Another live process runs this run."""


def _lock(ctx: Any) -> StageLock:
    sc = ctx.cfg.store
    return StageLock(
        ctx.store,
        f"{ctx.store.run_uri(ctx.run_id)}/run",
        owner=f"{ctx.run_id} (pid {os.getpid()})",
        stale_after_s=sc.lock_stale_after_s,
        heartbeat_s=sc.lock_heartbeat_s,
    )


@contextlib.contextmanager
def holding_run(ctx: Any) -> Iterator[StageLock]:
    """Hold ``ctx``'s run for the block, or raise ``RunBusy`` naming who holds it. Re-entrant in one process
    (the command holds it, then the flow it runs in this process holds it again)."""
    key = (ctx.store.root, ctx.run_id)
    if key in _HELD:
        yield _HELD[key]
        return
    lock = _lock(ctx)
    try:
        lock.acquire(wait=False)
    except LockHeld as e:
        raise RunBusy(
            f"run {ctx.run_id} is running in another process: {e}; wait for it to end (or stop it), then "
            "resume. A holder that died is noticed by itself: on this machine at once, elsewhere after "
            f"store.lock_stale_after_s={ctx.cfg.store.lock_stale_after_s:g} s without its heartbeat"
        ) from None
    _HELD[key] = lock
    try:
        yield lock
    finally:
        del _HELD[key]
        recorded = ctx.store.exists(f"{ctx.store.run_uri(ctx.run_id)}/{RUN_RECORD}")
        lock.release()
        if not recorded:  # refused before its record was written: no folder of a run that never was
            ctx.store.remove_if_empty(ctx.store.run_uri(ctx.run_id))


def run_guard(ctx: Any) -> Any:
    """What a stage of ``ctx``'s run calls right before committing (``run_stage``'s ``guard``): raises
    ``LockLost`` when this process no longer holds the run (its heartbeat starved, and another broke it). None
    where the run is not held here (a stage replayed, or run by a tool, outside a run)."""
    lock = _HELD.get((ctx.store.root, ctx.run_id))
    return None if lock is None else lock.check
