"""The Prefect API server, started one way for every use: the local stack's (UI on), a run's private one (UI
off, dies with the run) and the test suite's (UI on, for the browser test).

It is ``uvicorn prefect.server.api.server:create_app`` on 127.0.0.1 (the app runs Prefect's services, the
scheduler included), with SQLite under ``home``, analytics off and its own log file.

    url = ensure_api()   # PREFECT_API_URL if set, else a private server tied to this process

A private server has no UI, and so none of the services that only feed one (``UI_ONLY_SERVICES``): a run
started without ``rlfoundry up`` shows its flow run, logs and vital-sign tables when its state folder is later
opened by the stack's UI, but not its task runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infra.localstack.process import Server, clean_env, spawn
from rl_core.artifacts.paths import free_port, state_dir

# What a server without a UI (a run's private one) leaves out: the services that turn the client's events
# into what only a UI shows (task runs and their states, the event feed, automations). Flow runs, their
# states, logs and artifacts still go through the API. On this project's 2-core machines the task-run
# recorder alone took ~115 ms of CPU per iteration of a small run beside its stages (a task run's three
# state events, each an SQLite upsert), all three ~145 ms (docs/concepts/speed.md).
UI_ONLY_SERVICES = ("TASK_RUN_RECORDER", "EVENT_PERSISTER", "TRIGGERS")


def server_env(port: int, home: Path, *, ui: bool, lean: bool | None = None) -> dict[str, str]:
    """The one Prefect server configuration; only the port, the home folder, the UI switch and whether the
    UI_ONLY_SERVICES run vary (``lean``, default: without the UI; the test suite's server has its UI for the
    browser test, and no test reads task runs)."""
    lean = not ui if lean is None else lean
    off = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in UI_ONLY_SERVICES} if lean else {}
    return clean_env(
        **off,
        PREFECT_HOME=str(home),
        PREFECT_UI_ENABLED="true" if ui else "false",
        PREFECT_UI_API_URL=f"http://127.0.0.1:{port}/api",  # else the UI calls the default port 4200
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        # SQLite serialises writers: on a busy 2-core machine Prefect's background services waited past the
        # default 10 s and logged "database is locked". Wait longer instead of failing.
        PREFECT_SERVER_DATABASE_TIMEOUT="60",
        PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT="30",
    )


def start(
    port: int, home: Path, log: Path, *, ui: bool, tie_to_parent: bool, lean: bool | None = None
) -> Server:
    """Start the server on 127.0.0.1:``port`` (not waiting for it: ``Server.wait_http(health_url(port))``)."""
    import prefect

    app_dir = str(Path(prefect.__file__).parent.parent)
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        app_dir,
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    return spawn(
        "Prefect server",
        cmd,
        env=server_env(port, home, ui=ui, lean=lean),
        log=log,
        tie_to_parent=tie_to_parent,
    )


def health_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/api/health"


def ensure_api() -> str:
    """PREFECT_API_URL if set, else a private server that dies with this process (set as PREFECT_API_URL);
    returns the API URL. Prefect's own ephemeral server would outlive a run killed with SIGKILL and keep its
    stdout open."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    port = free_port()
    home = Path(os.environ.get("PREFECT_HOME") or state_dir() / "prefect")
    log = state_dir() / "logs" / f"prefect-server-{port}.log"
    start(port, home, log, ui=False, tie_to_parent=True).wait_http(health_url(port), timeout_s=120)
    os.environ["PREFECT_API_URL"] = url = f"http://127.0.0.1:{port}/api"
    if "prefect.context" in sys.modules:  # Prefect read its settings when imported (``start`` imports it):
        # without this, its client would not see the URL and would start an ephemeral server of its own
        sys.modules["prefect.context"].refresh_global_settings_context()
    return url
