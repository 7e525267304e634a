"""A Ray cluster of several nodes on this machine, for the tests and benchmarks of the cluster path: a head
that runs the driver and no work (0 CPUs) and ``workers`` nodes of ``cpus`` logical CPUs each, all on
127.0.0.1. Ray's servers listen on every interface whatever address they are given: start it inside a network
namespace of its own (``unshare --net``, loopback up), as ``tests/integration/test_ray_cluster.py`` and
``benchmarks/cluster.py`` do.

    with local_cluster(workers=2) as cluster:
        run(["--set", f"cluster.ray_address={cluster.address}"])
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")   # a node joins
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def local_cluster(workers: int = 2, cpus: int = 1, scratch: Path | None = None) -> Iterator[Any]:
    """``ray.cluster_utils.Cluster`` with its nodes up (``cpus`` logical CPUs each); shut down on exit. With
    ``scratch``, each worker node gets scratch folders of its own there (``node_scratch``)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    try:
        for i in range(workers):
            extra = {"env_vars": node_scratch(scratch, f"node-{i}")} if scratch else {}
            cluster.add_node(num_cpus=cpus, node_ip_address="127.0.0.1", **extra)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def node_scratch(scratch: Path, name: str) -> dict[str, str]:
    """The environment of a node whose processes keep their scratch apart from every other node's: its own
    temporary folder (TMPDIR: the rollout engines' policy folders) and cache (XDG_CACHE_HOME: the checkpoints
    its ranks fetch from the store), as on machines that share no disk. vLLM's cache (what it learnt
    inspecting a model class: ~20 s of a fresh interpreter when cold) and the compiled ops (DeepSpeed's CPU
    communication op: a C++ build on each node when cold) stay this machine's, as a real node keeps
    its own warm across runs."""
    from rl_core.artifacts.paths import torch_extensions_dir, vllm_cache_root

    tmp, cache = scratch / name / "tmp", scratch / name / "cache"
    tmp.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(cache),
        "VLLM_CACHE_ROOT": vllm_cache_root(),
        "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
    }


def private_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a command inside the namespace: no Prefect server or fork server from outside it (a run
    starts a private Prefect server)."""
    return {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "RLFOUNDRY_TEST_FORKSERVER")}
