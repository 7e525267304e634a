"""The reward server: vLLM's pooling runner (``vllm serve FOLDER --runner pooling``) on a reward model folder
(``rl_core/scoring/reward_model.py``), a process of its own on 127.0.0.1. Its ``/classify`` endpoint scores
token ids with the model's scalar head (``use_activation: false``: the raw score, not a sigmoid of it); vLLM
batches concurrent requests itself; ``/health`` answers once it is ready.

Started by the flow when ``reward.weights`` has ``reward_model`` and ``reward.model.url`` is empty (tied to
the flow's process: it ends with it, and a dead one is restarted by the score stage's client), or by
``rlfoundry up --reward-server`` (``infra.localstack.stack``), kept until ``rlfoundry down``.

    srv = RewardServer("/tmp/rm", kv_cache_mb=64)
    url = srv.start()         # waits until /health answers
    url = srv.restart()       # a dead server comes back (on a new port)
    srv.stop()
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from infra.localstack.process import Server, ServerError, spawn
from infra.rollout_servers import vllm_server_env
from rl_core.artifacts.paths import free_port, state_dir
from rl_core.models.vllm_args import cuda_visible, reward_vllm_args, vllm_flags
from rl_core.scoring.reward_model import reward_folder_problem

SERVED_NAME = "reward"


def check_reward_folder(path: str | Path) -> Path:
    """A reward model folder (config with one label, weights, tokenizer), else an error naming what it
    lacks."""
    if why := reward_folder_problem(path):
        raise ServerError(f"reward server: {why}")
    return Path(path)


class RewardServer:
    def __init__(
        self,
        path: str | Path,
        *,
        kv_cache_mb: int = 64,
        logs: Path | None = None,
        tie_to_parent: bool = True,
        placement: Any = None,
    ):
        """``placement``: the run's (rl_core.models.placement.plan): on a GPU machine the server's vLLM
        arguments (``reward_vllm``: its memory share) and its GPU, the rollout engine's first; None (or a CPU
        machine's): a KV cache of ``kv_cache_mb`` on the CPU."""
        self.path = check_reward_folder(path)
        self.kv_cache_mb = kv_cache_mb
        on_gpu = placement is not None and bool(placement.reward_vllm)
        self.device_args: dict[str, Any] = dict(placement.reward_vllm) if on_gpu else {}
        self.gpus: tuple[int, ...] = placement.rollout_gpus[:1] if on_gpu else ()
        self.logs = logs or state_dir() / "logs"
        self.tie_to_parent = tie_to_parent  # False: outlive the starting process (``rlfoundry up``)
        self.server: Server | None = None
        self.url = ""

    def _command(self, port: int) -> list[str]:
        max_len = json.loads((self.path / "config.json").read_text())["max_position_embeddings"]
        device = reward_vllm_args(max_len, self.kv_cache_mb, self.device_args)
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.path),
            "--runner",
            "pooling",
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(max_len),
            "--distributed-executor-backend",
            "uni",  # the model in the engine core's process (on the CPU with vllm_server_env's setting)
            "--seed",
            "0",
            "--max-num-seqs",
            "256",
            *vllm_flags(device),  # rl_core.models.placement's decision (on the CPU: eager, a fixed KV cache)
        ]

    def _env(self) -> dict[str, str]:
        env = vllm_server_env(on_gpu=bool(self.gpus))
        if self.gpus:  # its GPU only (rl_core.models.placement)
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible(self.gpus, dict(os.environ))
        return env

    def start(self) -> str:
        """Start the server; its URL once ``/health`` answers."""
        port = free_port()
        env = self._env()
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"reward-server-{port}.log"
        self.server = spawn(
            "reward server", self._command(port), env=env, log=log, tie_to_parent=self.tie_to_parent
        )
        url = f"http://127.0.0.1:{port}"
        self.server.wait_http(url + "/health", timeout_s=600)
        self.url = url
        return url

    def restart(self) -> str:
        """Stop what is left of the server and start it again on the same folder; its new URL."""
        self.stop()
        return self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
