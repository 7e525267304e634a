"""Joining the Ray cluster a run names (``cluster.ray_address``): once per process, the project's code
travelling with the job. The run's checks before work (``rl_core.run.preflight``) and the train stage's Ray
launcher (``rl_core.training.ray_launch``) both join through here.

    connect("ray://head:10001")
"""

from __future__ import annotations

from rl_core.artifacts.paths import PROJECT_ROOT


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` unless this process already has."""
    import ray

    if not ray.is_initialized():
        env = {"PYTHONPATH": str(PROJECT_ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
        ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
