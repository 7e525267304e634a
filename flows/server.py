"""A Prefect API server for this process: the one in PREFECT_API_URL, or a private one started on 127.0.0.1.

Prefect's own ephemeral server outlives a run killed with SIGKILL and keeps its parent's stdout open. The
server started here instead gets PR_SET_PDEATHSIG (the kernel kills it when its parent dies, however it dies)
and writes to its own log file under the state dir.

    ensure_api()          # sets PREFECT_API_URL for this process if it was not set
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rl_core.paths import free_port, state_dir

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_server(
    port: int, *, ui: bool = False, tie_to_parent: bool = True, log: Path | None = None
) -> subprocess.Popen:
    """Start ``uvicorn prefect.server.api.server:create_app`` on 127.0.0.1:port (SQLite under PREFECT_HOME)."""
    import prefect

    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "1" if ui else "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",  # else the UI calls the default port 4200
    }
    env.pop("PREFECT_API_URL", None)
    log = log or state_dir() / "logs" / f"prefect-server-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent), "--factory",
           "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error",
           "--lifespan", "on"]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )  # fmt: skip


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"Prefect server exited with code {proc.returncode} (log under {state_dir() / 'logs'})"
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"Prefect server at {url} not healthy after {timeout_s:.0f} s")


def ensure_api() -> str:
    """PREFECT_API_URL if set, else a private server tied to this process; returns the API URL."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}/api"
    wait_healthy(url, proc)
    os.environ["PREFECT_API_URL"] = url
    return url
