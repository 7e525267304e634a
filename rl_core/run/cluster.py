"""Joining the Ray cluster a run names (``cluster.ray_address``): once per process, the project's code
travelling with the job. The run's checks before work (``rl_core.run.preflight``) and the train stage's Ray
launcher (``rl_core.training.ray_launch``) both join through here.

    connect("ray://head:10001")
"""

from __future__ import annotations

from rl_core.artifacts.paths import PROJECT_ROOT


def connect(address: str, env: str = "") -> None:
    """Join the Ray cluster at ``address`` unless this process already has. ``env``: the run's
    ``task.env``; a user's environment package the cluster lacks is uploaded with the job (``py_modules``).
    The job's runtime environment is fixed by the first join, so every caller names the run's env."""
    import ray

    from envs.base import env_source

    if not ray.is_initialized():
        source = env_source(env) if env else None
        runtime: dict[str, object] = {
            "env_vars": {"PYTHONPATH": str(PROJECT_ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
            **({"py_modules": [str(source)]} if source is not None else {}),
        }
        ray.init(address=address, log_to_driver=False, runtime_env=runtime)
