"""A lock in the store, for a stage that several runs may build at once (the shared base model's init and
warm-up, ``_base/<hash>``): it works wherever the store is — one machine's folder, an NFS mount shared by a
work pool's pods, S3 — because it is only objects in the store.

    with StageLock(store, stage_uri, owner="run-7") as lock:   # waits while another run holds it
        run_stage(..., guard=lock.check)                       # committed only while still held

The lock is ``<stage folder>.lock``, created by a conditional create (``Store.create_exclusive``: S3's
``If-None-Match: *``, a hard link locally), holding a random token and who holds it. While it is held, a
thread writes a heartbeat beside it (``.lock-<token>.beat``, a counter) every ``heartbeat_s``; the holder
never rewrites the lock itself, so it cannot steal it back.

The stale-lock rule (a killed holder): a waiter treats the lock as abandoned when its holder's process is
gone (same host: the pid no longer runs) or its heartbeat has not changed for ``stale_after_s`` of the
*waiter's* clock (no clock is compared across machines). Breaking it is itself exclusive: the waiter that
creates ``.lock-<token>.broken`` deletes the lock, provided it still holds that token; every waiter then
competes for the lock again. A holder whose lock was broken (a heartbeat starved for ``stale_after_s``) finds
out at its next heartbeat or at ``check()``, and its stage fails instead of committing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from rl_core.artifacts.store import ArtifactError, Store

log = logging.getLogger("rlfoundry.lock")


class LockLost(ArtifactError):
    """The lock was broken while held (its heartbeat stopped for longer than the stale rule allows)."""


class LockHeld(RuntimeError):
    """``acquire(wait=False)`` found the lock held by a live holder (its process runs, or it beats)."""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a killed one not yet reaped by its parent: no)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): existing is all we know
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")  # zombie or dead


class StageLock:
    """Exclusive hold of one stage folder of the store; see the module docstring for the rules."""

    def __init__(
        self,
        store: Store,
        stage_uri: str,
        *,
        owner: str,
        stale_after_s: float = 60.0,
        heartbeat_s: float = 10.0,
        poll_s: float | None = None,
    ):
        if heartbeat_s * 3 > stale_after_s:
            raise ValueError(f"lock heartbeat {heartbeat_s} s must be at most a third of {stale_after_s} s")
        self.store, self.uri, self.owner = store, f"{stage_uri}.lock", owner
        self.stale_after_s, self.heartbeat_s = stale_after_s, heartbeat_s
        self.poll_s = poll_s if poll_s is not None else (0.2 if store.is_local else 1.0)
        self.token = secrets.token_hex(8)
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._beats = 0
        self._thread: threading.Thread | None = None

    # -- the objects ----------------------------------------------------------------------------------
    def _beat_uri(self, token: str) -> str:
        return f"{self.uri}-{token}.beat"

    def _holder(self) -> dict[str, Any] | None:
        data = self.store.read_bytes_if_any(self.uri)
        if data is None:
            return None
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ArtifactError(f"lock {self.uri} is unreadable ({e}); remove it if no run holds it") from e

    def _beat(self) -> None:
        self._beats += 1
        self.store.write_bytes(self._beat_uri(self.token), str(self._beats).encode())

    # -- holding ----------------------------------------------------------------------------------------
    def acquire(self, wait: bool = True) -> StageLock:
        """Wait until this process holds the lock (as long as a live holder keeps beating). ``wait`` False:
        raise ``LockHeld`` naming the holder once it is known to be live (on this host: its process runs;
        elsewhere: its heartbeat moved), still breaking a dead or stale one."""
        me = {"token": self.token, "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}
        t0 = time.monotonic()
        seen: tuple[str, bytes | None] | None = None  # (holder's token, its last heartbeat)
        seen_at = t0
        said = 0.0
        while True:
            if self.store.create_exclusive(self.uri, json.dumps(me).encode()):
                break
            holder = self._holder()
            if holder is None:
                continue  # released between our create and read
            if holder.get("token") == self.token:  # a retried create whose first attempt had landed
                break
            beat = self.store.read_bytes_if_any(self._beat_uri(holder["token"]))
            now = time.monotonic()
            moved = seen is not None and seen[0] == holder["token"] and seen[1] != beat
            if seen is None or seen != (holder["token"], beat):
                seen, seen_at = (holder["token"], beat), now
            here = holder.get("host") == me["host"]
            dead = here and not _alive(int(holder.get("pid", -1)))
            if not wait and not dead and (here or moved):
                who = f"{holder.get('owner')} (pid {holder.get('pid')} on {holder.get('host')})"
                raise LockHeld(f"{self.uri} is held by {who}")
            if dead or now - seen_at > self.stale_after_s:
                why = "its process is gone" if dead else f"no heartbeat for {now - seen_at:.0f} s"
                self._break(holder, why)
                seen = None
                continue
            if now - said > 30:
                who = f"{holder.get('owner')} on {holder.get('host')}"
                log.warning("waiting for %s (held by %s)", self.uri, who)
                said = now
            time.sleep(self.poll_s)
        self._beat()
        self._thread = threading.Thread(target=self._heartbeats, name="rlfoundry-lock", daemon=True)
        self._thread.start()
        return self

    def _break(self, holder: dict[str, Any], why: str) -> None:
        token = holder["token"]
        marker = f"{self.uri}-{token}.broken"
        if not self.store.create_exclusive(marker, self.token.encode()):
            return  # another waiter is breaking it
        again = self._holder()
        if again is not None and again.get("token") == token:
            log.warning("breaking the lock %s of %s: %s", self.uri, holder.get("owner"), why)
            self.store.remove(self.uri)
        self.store.remove(self._beat_uri(token))
        self.store.remove(marker)

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                holder = self._holder()
                if holder is None or holder.get("token") != self.token:
                    self._lost.set()
                    return
                self._beat()
            except Exception as e:  # the store is briefly unreachable: the next beat tries again
                log.warning("heartbeat of %s failed: %s", self.uri, e)

    def check(self) -> None:
        """Raise ``LockLost`` unless this process still holds the lock (call it right before committing)."""
        holder = self._holder()
        if self._lost.is_set() or holder is None or holder.get("token") != self.token:
            raise LockLost(
                f"lost the lock {self.uri} while building it (another run broke it after this one's "
                "heartbeat stopped); nothing committed by this run: resume it"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = self._holder()
        if holder is not None and holder.get("token") == self.token:
            self.store.remove(self.uri)
        self.store.remove(self._beat_uri(self.token))

    def __enter__(self) -> StageLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_shared_stage(
    store: Store,
    prefix: str,
    iteration: int,
    stage: str,
    config_hash: str,
    inputs: dict[str, Any],
    body: Any,
    *,
    holder: str,
    stale_after_s: float = 60.0,
    heartbeat_s: float = 10.0,
) -> Any:
    """``rl_core.artifacts.stage.run_stage`` for a stage several runs share (``prefix`` = ``_base/<hash>``):
    under its lock unless it is committed already, so runs started together build it once and the others reuse
    it."""
    from rl_core.artifacts.stage import committed, run_stage

    if committed(store, prefix, iteration, stage) is not None:
        return run_stage(store, prefix, iteration, stage, config_hash, inputs, body)
    uri = store.stage_uri(prefix, iteration, stage)
    with StageLock(store, uri, owner=holder, stale_after_s=stale_after_s, heartbeat_s=heartbeat_s) as lock:
        return run_stage(store, prefix, iteration, stage, config_hash, inputs, body, guard=lock.check)
