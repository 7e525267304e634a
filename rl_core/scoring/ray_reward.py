"""The reward model on a Ray cluster (``cluster.ray_address`` with ``reward_model`` in ``reward.weights`` and
no ``reward.model.url``): one Ray actor, placed like the run's other actors (``rl_core.run.cluster.place``: a
CPU, and a GPU of its own on a GPU machine), holds vLLM's pooling runner on the reward model folder, the same
engine and arguments as the flow's reward server on one machine (``infra/reward_server.py``,
``reward_vllm_args``), in the actor's own process. The folder's files go through Ray's object store into
scratch of the actor's own: no local path crosses nodes. The score stage's client (``RewardClient``) sends it
the same token-id batches it would post to a server; a dead actor (its node lost) is a failure worth a retry,
and the client replaces it with a new one, placed anew, as it restarts a dead server; when the retries are
spent the stage fails naming the actor's node. Its node is recorded in the score stage's manifest
(``placement.reward_model``).

    scorer = RayRewardModel(ctx, "/tmp/rm")     # placed and started on the run's cluster
    scorer.classify([[5, 7, 9], [5, 7, 8]])     # [1.93, -0.41]
    scorer.close()                              # the actor and its placement group gone
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rl_core.generation.ray_engines import folder_files
from rl_core.run.cluster import DIED, PlacementTimeout, Probe, last_line, place, release
from rl_core.scoring.reward_client import RewardServerError, Transient
from rl_core.scoring.reward_model import reward_folder_problem


class _RewardModel(Probe):
    """vLLM's pooling runner on a reward model folder, in a Ray actor's process."""

    def start(self, files: dict[str, bytes], kv_cache_mb: int, device_args: dict[str, Any]) -> None:
        from rl_core.artifacts.paths import vllm_env
        from rl_core.models.vllm_args import captured_stderr, reward_vllm_args

        folder = Path(tempfile.mkdtemp(prefix="rlfoundry-reward-"))  # this node's own scratch
        for rel, data in files.items():
            (folder / rel).write_bytes(data)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this actor's process
        os.environ.update(vllm_env())
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        max_len = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
        with captured_stderr():
            self.llm = LLM(
                model=str(folder),
                runner="pooling",
                dtype="float32",
                max_model_len=max_len,
                seed=0,
                max_num_seqs=256,
                **reward_vllm_args(max_len, kv_cache_mb, device_args),
            )

    def classify(self, ids: list[list[int]]) -> list[float]:
        """The raw score (``use_activation: false``, as the server is asked) of each token-id sequence."""
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt

        outs = self.llm.classify(
            [TokensPrompt(prompt_token_ids=i) for i in ids],
            pooling_params=PoolingParams(use_activation=False),
            use_tqdm=False,
        )
        return [float(o.outputs.probs[0]) for o in outs]


class RayRewardModel:
    """The reward model as a Ray actor on the run's cluster: a ``Scorer`` of ``rl_core.scoring.reward_client``
    (``name`` for messages, ``placement`` for the manifest)."""

    def __init__(self, ctx: Any, path: str | Path):
        import ray

        if why := reward_folder_problem(path):
            raise RewardServerError(f"reward model: {why}")
        folder = Path(path)
        self.address = ctx.cfg.cluster.ray_address
        self.timeout_s = ctx.cfg.reward.model.timeout_s
        gpu_args = dict(ctx.placement.reward_vllm) if ctx.placement.reward_vllm else {}
        try:
            self.pg, actors, where = place(
                ctx,
                _RewardModel,
                "the reward model (reward.model.path)",
                count=1,
                gpus=1 if gpu_args else 0,
                unit="reward model actor",
            )
        except PlacementTimeout as e:
            raise RewardServerError(str(e)) from None
        self.actor = actors[0]
        w = where[0]
        self.placement = {
            "ray_address": self.address,
            "reward_model": {k: w[k] for k in ("node", "address", "device")},
        }
        self.name = f"Ray actor on node {w['node'][:12]} ({w['address']}, cluster {self.address})"
        files = ray.put(folder_files(folder))
        try:
            ray.get(self.actor.start.remote(files, ctx.cfg.reward.model.kv_cache_mb, gpu_args))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
            self.close()
            raise RewardServerError(f"reward server {self.name}: it did not start: {last_line(e)}") from None

    def healthy(self) -> bool:
        import ray

        try:
            ray.get(self.actor.where.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return True

    def classify(self, ids: list[list[int]]) -> list[float]:
        import ray

        try:
            return ray.get(self.actor.classify.remote(ids), timeout=self.timeout_s)
        except ray.exceptions.RayActorError:
            raise Transient(DIED) from None
        except ray.exceptions.GetTimeoutError:
            raise Transient(f"no answer within reward.model.timeout_s={self.timeout_s:g}") from None
        except ray.exceptions.RayTaskError as e:
            raise RewardServerError(f"reward server {self.name}: it failed: {last_line(e)}") from None

    def close(self) -> None:
        release(self.pg, [self.actor])
