"""Where a run's workloads run beyond one machine (the ``cluster`` section of the one schema): placement
only, so the whole section is left out of every config hash (``rl_core.run.context``) and a run resumes on
another cluster, or on one machine, without ``--force``.

    rlfoundry run configs/smoke.yaml --set cluster.ray_address=ray://head:10001 --set train.world_size=4
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClusterSection(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ray_address: str = Field(
        "",
        description="A running Ray cluster to join (ray://head:10001 or head:6379). Set: each launched train "
        "stage (train.world_size or tp_size > 1) runs its ranks as Ray actors placed by a placement group "
        "(DeepSpeed over torch.distributed, rendezvous on rank 0's node), rollout.servers engines run as "
        "Ray actors there (weights synced through Ray's object store after every update), and execute_envs "
        "with task.executor=ray runs its environment workers there (unless task.ray_address names another). "
        "Empty: one machine (torchrun), as without it.",
    )
    ready_timeout_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="How long a stage waits for the cluster to place its ranks or engines.",
    )
