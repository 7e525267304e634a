"""The local stack: a real S3 server (SeaweedFS), a Prefect server with its UI and an MLflow server with its
UI, all on 127.0.0.1, started by ``rlfoundry up`` and stopped by ``rlfoundry down``.

State lives in ``<state dir>/stack/`` between the two: the S3 data, Prefect's database, the ports (kept, so
URLs recorded in MLflow stay valid after a restart), the logs and ``stack.json`` with each server's identity
(pid and create time: ``down`` stops exactly those processes, never a reused pid). MLflow's server reads the
same SQLite database that runs write, so every run is in its UI. The servers are started and stopped by
``infra.localstack.process``, like every other server rlfoundry starts.

S3 credentials come from the environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``); without them
``up`` generates a pair into ``stack/credentials.json`` (mode 600). They are passed to the servers through
their environment or a mode-600 file, never on a command line, and never printed.

While the stack is up, every ``rlfoundry`` command uses it (``apply_env``): Prefect API, S3 endpoint and
credentials, unless the environment already names its own.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from infra.localstack import prefect_server
from infra.localstack.process import Server, ServerError, clean_env, spawn
from rl_core.artifacts.paths import free_port, shed_dead_sockets, state_dir

BUCKET = "rlfoundry"


def stack_dir() -> Path:
    d = state_dir() / "stack"
    d.mkdir(parents=True, exist_ok=True)
    return d


ROLLOUT_TOKEN_FILE = "rollout_token.json"  # 0600: the bearer token of up's rollout servers


def _read(name: str) -> dict[str, Any]:
    p = stack_dir() / name
    return json.loads(p.read_text()) if p.exists() else {}


def _write(name: str, data: dict[str, Any], mode: int = 0o644) -> None:
    p = stack_dir() / name
    tmp = p.with_suffix(".tmp")
    tmp.touch(mode=mode)
    tmp.chmod(mode)  # before anything secret is written
    tmp.write_text(json.dumps(data, indent=1))
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
        svc["alive"] = Server.from_record(svc).alive()
    return data


def is_up(data: dict[str, Any] | None = None) -> bool:
    services = (status() if data is None else data).get("services", {})
    return bool(services) and all(s["alive"] for s in services.values())


def _start_s3(d: Path, ports: dict[str, Any], creds: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    from infra.localstack.s3_server import S3Server

    s3 = S3Server.start(
        d / "s3",
        access_key=creds["AWS_ACCESS_KEY_ID"],
        secret_key=creds["AWS_SECRET_ACCESS_KEY"],
        ports=ports.get("s3"),
    )
    ports["s3"] = s3.ports
    return s3, s3.server.record(url=s3.endpoint, bucket=BUCKET)


def _start_mlflow(port: int, s3_endpoint: str, creds: dict[str, str], log: Path) -> Server:
    env = clean_env(
        **creds,
        AWS_ENDPOINT_URL=s3_endpoint,
        MLFLOW_S3_ENDPOINT_URL=s3_endpoint,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="true",
    )
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-store-uri",
        f"sqlite:///{state_dir() / 'mlflow.db'}",
        "--default-artifact-root",
        (state_dir() / "mlartifacts").as_uri(),
        "--workers",
        "1",
    ]
    return spawn("MLflow server", cmd, env=env, log=log)


def up() -> dict[str, Any]:
    """Start the three services (or report the running ones); returns ``status()``."""
    current = status()
    if is_up(current):
        return current
    if current.get("services"):
        down()  # a half-dead stack: stop what is left, start afresh on the same ports
    d = stack_dir()
    ports = _read("ports.json")
    creds = credentials()
    started: dict[str, Server] = {}
    records: dict[str, Any] = {}
    try:
        s3, records["s3"] = _start_s3(d, ports, creds)
        started["s3"] = s3.server
        _ensure_bucket(s3.endpoint, creds)
        ports.setdefault("prefect", free_port())
        ports.setdefault("mlflow", free_port())
        pf = prefect_server.start(
            ports["prefect"], d / "prefect", d / "logs" / "prefect.log", ui=True, tie_to_parent=False
        )
        started["prefect"] = pf
        url = f"http://127.0.0.1:{ports['prefect']}"
        records["prefect"] = pf.record(url=url, api=f"{url}/api")
        ml = _start_mlflow(ports["mlflow"], s3.endpoint, creds, d / "logs" / "mlflow.log")
        started["mlflow"] = ml
        records["mlflow"] = ml.record(url=f"http://127.0.0.1:{ports['mlflow']}")
        pf.wait_http(
            prefect_server.health_url(ports["prefect"])
        )  # both start at once: ~15 s instead of ~25 s
        ml.wait_http(f"{records['mlflow']['url']}/health")
    except BaseException:
        for srv in started.values():
            srv.stop()
        raise
    _write("ports.json", ports)
    _write("stack.json", {"services": records, "started_at": time.time()})
    return status()


def _ensure_bucket(endpoint: str, creds: dict[str, str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=endpoint,
        key=creds["AWS_ACCESS_KEY_ID"],
        secret=creds["AWS_SECRET_ACCESS_KEY"],
        skip_instance_cache=True,
    )
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)


def check_model_folder(model_dir: Path) -> None:
    """A rollout server's model: a Hugging Face checkpoint folder (config, weights, tokenizer), else an error
    naming the folder and what it lacks."""
    need = ("config.json", "model.safetensors", "tokenizer.json")
    missing = [f for f in need if not (model_dir / f).exists()]
    if not model_dir.is_dir() or missing:
        what = "is not a folder" if not model_dir.is_dir() else f"has no {', '.join(missing)}"
        raise ServerError(f"rollout servers: {model_dir} {what} (a Hugging Face checkpoint folder)")


def _s3_env() -> dict[str, str]:
    """The stack's S3 endpoint and key pair (nothing when the stack is not up)."""
    data = status()
    if not is_up(data):
        return {}
    return {
        "AWS_ENDPOINT_URL": data["services"]["s3"]["url"],
        "AWS_DEFAULT_REGION": "us-east-1",
        **credentials(),
    }


def start_rollout_servers(model_dir: Path, n: int, cfg: Any) -> list[str]:
    """Start ``n`` vLLM rollout servers (``infra.rollout_servers``, the settings of ``cfg.rollout``) on the
    checkpoint folder ``model_dir``; they outlive ``up`` and are recorded for ``down``. Their URLs: a run uses
    them with ``rollout.server_urls``. Placed as a run of ``cfg`` with ``rollout.servers: n`` would place its
    own (rl_core.models.placement: on a GPU machine each takes its share of ``rollout.gpus``)."""
    from infra.rollout_servers import RolloutServers
    from rl_core.models.placement import Machine, engine_dtype, plan

    rollout = cfg.rollout.model_copy(update={"servers": n, "server_urls": []})
    placed = plan(cfg.model_copy(update={"rollout": rollout}), Machine.this())

    check_model_folder(model_dir)
    kept = [r for r in _read("rollout.json").get("servers", []) if Server.from_record(r).alive()]
    token = _read(ROLLOUT_TOKEN_FILE).get("token") if kept else None  # one token for all of up's servers
    servers = RolloutServers(
        model_dir,
        cfg.rollout,
        max_model_len=cfg.model.max_position,
        logs=stack_dir() / "logs",
        tie_to_parent=False,
        token=token,
        env=_s3_env(),  # the servers fetch each new checkpoint from the store themselves
        dtype=engine_dtype(cfg),
        placement=placed,
    )
    _write(ROLLOUT_TOKEN_FILE, {"token": servers.token}, mode=0o600)
    urls = servers.start(n)
    records = [srv.record(url=url) for srv, url in zip(servers.servers, urls, strict=True)]
    _write("rollout.json", {"model": str(model_dir), "servers": kept + records})
    return urls


def rollout_server_urls() -> list[str]:
    """The URLs of the rollout servers ``up`` started that are still alive."""
    return [r["url"] for r in _read("rollout.json").get("servers", []) if Server.from_record(r).alive()]


def start_reward_server(model_dir: Path, kv_cache_mb: int) -> str:
    """Start a reward server (``infra.reward_server``, vLLM's pooling runner) on the reward model folder
    ``model_dir``; it outlives ``up`` and is recorded for ``down``. Its URL: a run uses it with
    ``reward.model.url``."""
    from infra.reward_server import RewardServer

    server = RewardServer(model_dir, kv_cache_mb=kv_cache_mb, logs=stack_dir() / "logs", tie_to_parent=False)
    url = server.start()
    assert server.server is not None
    kept = [r for r in _read("reward.json").get("servers", []) if Server.from_record(r).alive()]
    _write("reward.json", {"servers": [*kept, server.server.record(url=url, model=str(model_dir))]})
    return url


def reward_server_urls() -> list[str]:
    """The URLs of the reward servers ``up`` started that are still alive."""
    return [r["url"] for r in _read("reward.json").get("servers", []) if Server.from_record(r).alive()]


def down() -> dict[str, bool]:
    """Stop the servers recorded by ``up`` (and their children), rollout and reward servers included, all at
    once (each after its own grace: ``Server.stop_grace_s``); returns {service: was running}, in the records'
    order."""
    from concurrent.futures import ThreadPoolExecutor

    records = dict(_read("stack.json").get("services", {}))
    for kind in ("rollout", "reward"):
        records.update({f"{kind}-{i}": r for i, r in enumerate(_read(f"{kind}.json").get("servers", []))})
    with ThreadPoolExecutor(max_workers=max(1, len(records))) as pool:
        ran = pool.map(lambda rec: Server.from_record(rec).stop(), records.values())
        stopped = dict(zip(records, ran, strict=True))
    if "s3" in records:
        from infra.localstack.s3_server import WEED_SOCKETS

        shed_dead_sockets(WEED_SOCKETS, "seaweedfs-*.sock")
    (stack_dir() / "stack.json").unlink(missing_ok=True)
    (stack_dir() / "rollout.json").unlink(missing_ok=True)
    (stack_dir() / "reward.json").unlink(missing_ok=True)
    return stopped


def apply_env() -> dict[str, str]:
    """Point this process at the running stack (Prefect API, S3 endpoint and credentials); values already in
    the environment win. Returns what was set (credentials masked)."""
    data = status()
    if not is_up(data):
        return {}
    services = data["services"]
    want = {
        "PREFECT_API_URL": services["prefect"]["api"],
        "AWS_ENDPOINT_URL": services["s3"]["url"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        want.update(credentials())
    if rollout_server_urls():  # the token of up's rollout servers, for runs that use them
        from rl_core.generation.rollout_server import ROLLOUT_TOKEN_ENV

        want[ROLLOUT_TOKEN_ENV] = _read(ROLLOUT_TOKEN_FILE).get("token", "")
    applied = {}
    for k, v in want.items():
        if not os.environ.get(k):
            os.environ[k] = v
            applied[k] = "***" if any(w in k for w in ("SECRET", "KEY_ID", "TOKEN")) else v
    return applied


__all__ = [
    "BUCKET",
    "ServerError",
    "apply_env",
    "check_model_folder",
    "credentials",
    "down",
    "is_up",
    "reward_server_urls",
    "rollout_server_urls",
    "stack_dir",
    "start_reward_server",
    "start_rollout_servers",
    "status",
    "up",
]
