"""The local stack: a real S3 server (SeaweedFS), a Prefect server with its UI and an MLflow server with its UI,
all on 127.0.0.1, started by ``rlfoundry up`` and stopped by ``rlfoundry down``.

State lives in ``<state dir>/stack/`` between the two: the S3 data, Prefect's database, the ports (kept, so
URLs recorded in MLflow stay valid after a restart), the logs and ``stack.json`` with each process's pid and
start time (``down`` stops exactly those processes, never a reused pid). MLflow's server reads the same SQLite
database that runs write, so every run is in its UI.

S3 credentials come from the environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``); without them
``up`` generates a pair into ``stack/credentials.json`` (mode 600). They are passed to the servers through
their environment, never on a command line, and never printed.

While the stack is up, every ``rlfoundry`` command uses it (``apply_env``): Prefect API, S3 endpoint and
credentials, unless the environment already names its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rl_core.paths import free_port, state_dir

BUCKET = "rlfoundry"


class StackError(RuntimeError):
    """A stack service failed to start; the message names it and its log."""


def stack_dir() -> Path:
    d = state_dir() / "stack"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(svc: dict[str, Any]) -> bool:
    return _start_time(svc["pid"]) == svc["start_time"]


def _read(name: str) -> dict[str, Any]:
    p = stack_dir() / name
    return json.loads(p.read_text()) if p.exists() else {}


def _write(name: str, data: dict[str, Any], mode: int = 0o644) -> None:
    p = stack_dir() / name
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.chmod(mode)
    os.replace(tmp, p)


def credentials() -> dict[str, str]:
    """The S3 key pair: from the environment, else the stack's generated one (created on first use)."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    saved = _read("credentials.json")
    if not saved:
        saved = {
            "AWS_ACCESS_KEY_ID": "rlf-" + secrets.token_hex(8),
            "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        }
        _write("credentials.json", saved, mode=0o600)
    return saved


def status() -> dict[str, Any]:
    """The running stack (``stack.json``) with each service's liveness, or {} when it is not up."""
    data = _read("stack.json")
    for svc in data.get("services", {}).values():
        svc["alive"] = _alive(svc)
    return data


def _wait_http(url: str, proc: subprocess.Popen, name: str, log: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{name} exited with code {proc.returncode} while starting; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.5)
    raise StackError(f"{name} not answering at {url} after {timeout_s:.0f} s; see {log}")


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _record(proc: subprocess.Popen, url: str, log: Path, **extra: Any) -> dict[str, Any]:
    return {"pid": proc.pid, "start_time": _start_time(proc.pid), "url": url, "log": str(log), **extra}


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_"))}
    for k in ("LD_PRELOAD",):  # set by vLLM in processes that started an engine
        env.pop(k, None)
    return env


def up() -> dict[str, Any]:
    """Start the three services (or report the running ones); returns ``status()``."""
    current = status()
    services = current.get("services", {})
    if services and all(s["alive"] for s in services.values()):
        return current
    if services:
        down()  # a half-dead stack: stop what is left, start afresh on the same ports
    from rl_core.s3server import S3Server

    d = stack_dir()
    ports = _read("ports.json")
    creds = credentials()
    started: dict[str, Any] = {}
    try:
        s3 = S3Server.start(
            d / "s3",
            access_key=creds["AWS_ACCESS_KEY_ID"],
            secret_key=creds["AWS_SECRET_ACCESS_KEY"],
            ports=ports.get("s3"),
        )
        ports["s3"] = s3.ports
        started["s3"] = _record(s3.proc, s3.endpoint, d / "s3" / "weed.log", bucket=BUCKET)
        _ensure_bucket(s3.endpoint, creds)

        ports.setdefault("prefect", free_port())
        env = {
            **_clean_env(),
            "PREFECT_HOME": str(d / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "true",
            "PREFECT_UI_ENABLED": "true",
            "PREFECT_UI_API_URL": f"http://127.0.0.1:{ports['prefect']}/api",
        }
        log = d / "logs" / "prefect.log"
        proc = _spawn([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                       str(ports["prefect"]), "--analytics-off"], env, log)  # fmt: skip
        url = f"http://127.0.0.1:{ports['prefect']}"
        started["prefect"] = _record(proc, url, log, api=f"{url}/api")
        waits = [(f"{url}/api/health", proc, "Prefect server", log)]

        ports.setdefault("mlflow", free_port())
        env = {
            **_clean_env(),
            **creds,
            "AWS_ENDPOINT_URL": s3.endpoint,
            "MLFLOW_S3_ENDPOINT_URL": s3.endpoint,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
        }
        log = d / "logs" / "mlflow.log"
        proc = _spawn([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(ports["mlflow"]),
                       "--backend-store-uri", f"sqlite:///{state_dir() / 'mlflow.db'}",
                       "--default-artifact-root", (state_dir() / "mlartifacts").as_uri(), "--workers", "1"],
                      env, log)  # fmt: skip
        url = f"http://127.0.0.1:{ports['mlflow']}"
        started["mlflow"] = _record(proc, url, log)
        waits.append((f"{url}/health", proc, "MLflow server", log))
        for w in waits:  # both start at once: ~15 s instead of ~25 s
            _wait_http(*w)
    except BaseException:
        _stop_all(started)
        raise
    _write("ports.json", ports)
    _write("stack.json", {"services": started, "started_at": time.time()})
    return status()


def _ensure_bucket(endpoint: str, creds: dict[str, str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=endpoint, key=creds["AWS_ACCESS_KEY_ID"], secret=creds["AWS_SECRET_ACCESS_KEY"],
        skip_instance_cache=True,
    )  # fmt: skip
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)


def _stop_all(services: dict[str, dict[str, Any]], timeout_s: float = 6.0) -> dict[str, bool]:
    """SIGTERM each recorded service's process group, SIGKILL what is left after ``timeout_s`` (weed ignores SIGTERM for a long while; its writes are already on disk); returns
    {service: was running}. A pid whose start time differs is someone else's process and is left alone."""
    running = {name: svc for name, svc in services.items() if _alive(svc)}
    for svc in running.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(svc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(s) for s in running.values()):
        for svc in running.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(svc["pid"], os.WNOHANG)
        time.sleep(0.2)
    for svc in running.values():
        if _alive(svc):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(svc["pid"], signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(svc["pid"], 0)
    return {name: name in running for name in services}


def down() -> dict[str, bool]:
    """Stop the processes recorded by ``up`` (and their children); returns {service: was running}."""
    data = _read("stack.json")
    stopped = _stop_all(data.get("services", {}))
    (stack_dir() / "stack.json").unlink(missing_ok=True)
    return stopped


def apply_env() -> dict[str, str]:
    """Point this process at the running stack (Prefect API, S3 endpoint and credentials); values already in
    the environment win. Returns what was set (credentials masked)."""
    data = status()
    services = data.get("services", {})
    if not services or not all(s["alive"] for s in services.values()):
        return {}
    want = {
        "PREFECT_API_URL": services["prefect"]["api"],
        "AWS_ENDPOINT_URL": services["s3"]["url"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        want.update(credentials())
    applied = {}
    for k, v in want.items():
        if not os.environ.get(k):
            os.environ[k] = v
            applied[k] = "***" if "SECRET" in k or "KEY_ID" in k else v
    return applied
