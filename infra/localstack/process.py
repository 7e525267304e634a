"""The one way rlfoundry starts and supervises a server process (S3, Prefect, MLflow).

- ``spawn`` starts it in its own session (so its process group is its own), stdin closed, stdout and stderr
  appended to its own log file; the command line never carries a credential (they travel in the environment).
- ``Server.wait_http`` waits until it answers, and fails naming the server and its log if it exits first.
- A server is identified by (pid, create time), as psutil reports them, so a pid the kernel has reused for
  another process is never signalled: ``Server.record()`` / ``Server.from_record()`` keep that identity in a
  JSON file between commands (``rlfoundry up`` then ``down``).
- ``Server.stop`` sends SIGTERM to its process group, waits, then SIGKILLs whatever of it is left (SeaweedFS
  ignores SIGTERM for a long while; its writes are already on disk).
- ``tie_to_parent=True`` makes it die with the process that started it, however that one dies (SIGKILL
  included): it runs under ``tether.py``, which watches the parent (pid and create time) and stops the server
  when the parent is gone. A run's private Prefect server uses it, so a killed ``rlfoundry run`` leaves no
  server behind.

    srv = spawn("Prefect server", cmd, env=env, log=state / "logs" / "prefect.log")
    srv.wait_http("http://127.0.0.1:4200/api/health")
    srv.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

TETHER = Path(__file__).with_name("tether.py")


class ServerError(RuntimeError):
    """A server failed to start or to answer; the message names it and its log."""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Prefect, MLflow and S3 settings (a server gets exactly the ones it
    is given) and without LD_PRELOAD (set by vLLM in a process that started an engine); plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_"))}
    env.pop("LD_PRELOAD", None)
    return {**env, **extra}


@dataclass
class Server:
    """A started server: its identity (pid, create time), its log, and the Popen handle when this process
    started it."""

    name: str
    pid: int
    create_time: float
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    # seconds ``stop`` waits between SIGTERM and SIGKILL (a server whose graceful stop never ends gets less)
    stop_grace_s: float = 6.0

    def record(self, **extra: Any) -> dict[str, Any]:
        """JSON-able identity, for ``from_record`` in a later command."""
        return {
            "name": self.name,
            "pid": self.pid,
            "create_time": self.create_time,
            "log": str(self.log),
            "stop_grace_s": self.stop_grace_s,
            **extra,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Server:
        name, grace = rec.get("name", "server"), float(rec.get("stop_grace_s", 6.0))  # older records: 6 s
        return cls(name, rec["pid"], rec["create_time"], Path(rec["log"]), stop_grace_s=grace)

    def _process(self) -> psutil.Process | None:
        """The live process with this identity, or None (gone, a zombie, or the pid now names another)."""
        try:
            p = psutil.Process(self.pid)
            if abs(p.create_time() - self.create_time) > 0.01 or p.status() == psutil.STATUS_ZOMBIE:
                return None
            return p
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return self._process() is not None

    def wait_http(self, url: str, *, timeout_s: float = 180.0, any_status: bool = False) -> None:
        """Return once ``url`` answers 200 (or anything, with ``any_status``: an S3 server answers 403)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.poll() if self.proc else None
                raise ServerError(f"{self.name} exited (code {code}) while starting; see {self.log}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError:
                if any_status:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise ServerError(f"{self.name} not answering at {url} after {timeout_s:.0f} s; see {self.log}")

    def stop(self, timeout_s: float | None = None) -> bool:
        """SIGTERM to its process group, SIGKILL to what is left after ``timeout_s`` (default: its
        ``stop_grace_s``); True if it ran."""
        timeout_s = self.stop_grace_s if timeout_s is None else timeout_s
        leader = self._process()
        if leader is None:
            self._reap()
            return False
        procs = [leader, *_children(leader)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)  # its own group: spawn started a session
        _, left = psutil.wait_procs(procs, timeout=timeout_s)
        for p in left + [c for q in left for c in _children(q)]:
            with contextlib.suppress(psutil.Error):  # psutil refuses a pid reused meanwhile
                p.kill()
        psutil.wait_procs(left, timeout=5)
        self._reap()
        return True

    def kill(self) -> None:
        """Stop it abruptly (an outage), without a clean shutdown."""
        leader = self._process()
        if leader is not None:
            for p in [leader, *_children(leader)]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs([leader], timeout=5)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def spawn(
    name: str, cmd: list[str], *, env: dict[str, str], log: Path, tie_to_parent: bool = False
) -> Server:
    """Start ``cmd`` as a server (see the module docstring); ``env`` is its whole environment."""
    if tie_to_parent:
        me = psutil.Process()
        cmd = [sys.executable, "-P", str(TETHER), str(me.pid), repr(me.create_time()), "--", *cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess as e:
        proc.wait()
        raise ServerError(f"{name} exited (code {proc.returncode}) at once; see {log}") from e
    return Server(name, proc.pid, created, log, proc)
