"""vLLM rollout servers as processes of their own (``rollout.servers: N``): started by the flow on the
policy's checkpoint folder, tied to the process that started them, on 127.0.0.1; or by ``rlfoundry up
--rollout-servers N`` (``infra.localstack.stack``), kept until ``rlfoundry down``.

Each is ``vllm serve``'s OpenAI-compatible API server with the settings the in-process engine uses (its dtype,
processed logprobs, prefix caching, and the device arguments rl_core.models.placement decides: on the CPU
eager, no chunked prefill, a fixed KV cache; on a GPU machine its memory share, CUDA graphs, chunked prefill,
and its own share of ``rollout.gpus``) plus ``VLLM_SERVER_DEV_MODE=1`` for the ``/collective_rpc`` weight sync
— a development endpoint that calls any worker method — so every route but ``/health`` needs the servers'
token (``infra/rollout_auth.py``: ``TokenAuth``, a random one per ``RolloutServers`` unless given), and the
servers listen on 127.0.0.1 (on a cluster: a private network and the token from a Secret,
``infra/k8s/rollout-servers.yaml``). The sync sends the committed checkpoint's store reference; each server
fetches and verifies it itself (``StoreCheckpointLoader``).

    servers = RolloutServers(ckpt_dir, rollout_cfg, max_model_len=64, logs=state / "logs")
    urls = servers.start(2)          # waits until each answers /health; servers.token authorises the run
    url = servers.restart(0)         # a dead server comes back on a new port
    servers.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from infra.localstack.process import Server, clean_env, spawn
from infra.rollout_auth import TOKEN_ENV
from rl_core.artifacts.paths import PROJECT_ROOT, free_port, state_dir, vllm_env, vllm_ipc_dir
from rl_core.models.engine_view import engine_folder
from rl_core.models.vllm_args import cuda_visible, rollout_server_args, vllm_flags


def vllm_server_env(*, on_gpu: bool, **extra: str) -> dict[str, str]:
    """The environment of a vLLM server process: this one's, cleaned (``clean_env``) and without what an
    engine or a launcher in this process set (LD_LIBRARY_PATH, single-process mode, ranks); plus ``extra``.

    On the CPU (``on_gpu`` False) the model runs in the engine core's process: vLLM's CPU platform swaps the
    in-engine executor for a worker process of its own unless ``VLLM_ENABLE_V1_MULTIPROCESSING`` is 0
    (``vllm/platforms/cpu.py``), and the API server keeps its engine core in a process of its own either way
    (vLLM's AsyncLLM always does). One process fewer to spawn and import: ``benchmarks/server_start.py``."""
    env = clean_env(
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="WARNING",
        **vllm_env(),
        **extra,
    )
    for k in ("LD_LIBRARY_PATH", "VLLM_ENABLE_V1_MULTIPROCESSING", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    if not on_gpu:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


class RolloutServers:
    def __init__(
        self,
        ckpt_dir: str | Path,
        rollout_cfg: Any,
        *,
        max_model_len: int,
        logs: Path | None = None,
        tie_to_parent: bool = True,
        token: str | None = None,
        env: dict[str, str] | None = None,
        dtype: str | None = None,
        placement: Any = None,
    ):
        """``dtype``: the engines' (rl_core.models.placement.engine_dtype of the run); None: rollout.dtype,
        with ``auto`` meaning float32 (never vLLM's own "auto", the folder's dtype). ``placement``: the run's
        (rl_core.models.placement.plan): on a GPU machine the servers' vLLM arguments and each server's GPUs;
        None (or a CPU machine's): the CPU arguments the in-process engine gets."""
        from rl_core.models.vllm_args import cpu_vllm_args

        self.ckpt_dir = str(ckpt_dir)
        on_gpu = placement is not None and bool(placement.server_gpus)
        self.device_args = placement.vllm if on_gpu else cpu_vllm_args(max_model_len, rollout_cfg.kv_cache_mb)
        self.gpus: tuple[tuple[int, ...], ...] = placement.server_gpus if on_gpu else ()
        self.dtype = dtype or ("float32" if rollout_cfg.dtype == "auto" else rollout_cfg.dtype)
        self.token = token or secrets.token_urlsafe(32)
        self.extra_env = env or {}  # e.g. XDG_CACHE_HOME: where the servers keep the checkpoints they fetch
        self.tie_to_parent = tie_to_parent  # False: outlive the starting process (``rlfoundry up``)
        self.cfg = rollout_cfg
        self.max_model_len = max_model_len
        self.logs = logs or state_dir() / "logs"
        self.servers: list[Server] = []

    def _command(self, port: int) -> list[str]:
        model = str(engine_folder(self.ckpt_dir))  # a tied model's untied view (rl_core.models.engine_view)
        return [
            *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model),
            *rollout_server_args(
                host="127.0.0.1",
                port=port,
                dtype=self.dtype,
                max_model_len=self.max_model_len,
                device_flags=vllm_flags(self.device_args),
            ),
        ]

    def _env(self, i: int) -> dict[str, str]:
        """Server ``i``'s environment: the store's endpoint and credentials (the servers fetch each new
        checkpoint from it themselves), the token, and on a GPU machine its share of rollout.gpus only."""
        store_env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        env = vllm_server_env(
            on_gpu=bool(self.gpus),
            VLLM_SERVER_DEV_MODE="1",
            **{TOKEN_ENV: self.token, **store_env, **self.extra_env},
        )
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible(self.gpus[i], dict(os.environ))
        return env

    def _start_one(self, i: int) -> tuple[Server, str]:
        port = free_port()
        env = self._env(i)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"rollout-server-{i}-{port}.log"
        name, tie = f"rollout server {i}", self.tie_to_parent
        env["TMPDIR"] = str(scratch := server_scratch())
        srv = spawn(name, self._command(port), env=env, log=log, tie_to_parent=tie)
        (scratch / OWNER).write_text(json.dumps(srv.record()))
        url = f"http://127.0.0.1:{port}"
        srv.wait_http(url + "/health", timeout_s=600)
        return srv, url

    def start(self, n: int) -> list[str]:
        """Start ``n`` servers at once; their URLs once all answer."""
        with ThreadPoolExecutor(max_workers=n) as pool:
            started = list(pool.map(self._start_one, range(n)))
        self.servers = [s for s, _ in started]
        return [u for _, u in started]

    def restart(self, i: int) -> str:
        """Stop what is left of server ``i`` and start it again on the checkpoint it started with (the caller
        then loads the current weights); its new URL."""
        self.servers[i].stop()
        self.servers[i], url = self._start_one(i)
        return url

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        shed_server_scratch()


# A server's temp folder: vLLM's engine writes its torch.distributed file store there (``vllm_dist_<hex>``),
# and a server stopped by a signal leaves it behind (one file in /tmp per server start, before). Each server
# gets a folder of its own in the private vLLM folder (``vllm_ipc_dir``), its identity in OWNER; a folder
# whose server is gone is removed by the next start or stop.
OWNER = "server.json"
SCRATCH_ORPHAN_S = 600.0  # a folder with no OWNER yet: a start in progress, unless this old


def server_scratch() -> Path:
    """A new temp folder for one server (after shedding those of servers that are gone)."""
    import tempfile

    shed_server_scratch()
    return Path(tempfile.mkdtemp(prefix="server-", dir=vllm_ipc_dir()))


def shed_server_scratch() -> int:
    """Remove the server temp folders whose server is gone; returns how many went."""
    import shutil
    import time

    gone = 0
    for folder in Path(vllm_ipc_dir()).glob("server-*"):
        try:
            owner = Server.from_record(json.loads((folder / OWNER).read_text()))
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - folder.stat().st_mtime > SCRATCH_ORPHAN_S:
                    shutil.rmtree(folder, ignore_errors=True)
            continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a record this code wrote: not ours to remove
        if not owner.alive():
            shutil.rmtree(folder, ignore_errors=True)
            gone += 1
    return gone
