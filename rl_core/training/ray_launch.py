"""The train stage's ranks as Ray actors on a cluster (``cluster.ray_address``): the same job as the torchrun
launcher's (``rl_core.training.train_launch``), placed by a Ray placement group instead of started on this
machine.

    launch_train_on_ray(ctx, job)     # in the flow: the StageResult of rank 0, with where each rank ran

The flow writes the job into the store (config, inputs, output folder, its placement); one actor per rank is
placed by a placement group of one bundle per rank (a CPU each, and a GPU each on a GPU machine), spread over
the cluster's nodes; rank 0's actor names its node's address and a free port there, every rank joins
torch.distributed there (gloo on CPU, NCCL on GPUs, as the launcher's) with RANK, LOCAL_RANK (its index
among the ranks on its node: ``cuda:LOCAL_RANK``) and WORLD_SIZE, and runs ``train_launch._rank``: it reads
its inputs from the store and rank 0 writes the checkpoint and the result file there. Nothing crosses nodes
by a local path: the store must be one every node reaches (S3 at scale).

A rank whose node is lost (its raylet or process killed) fails the stage in one line naming the rank, its
node and the workload; nothing is committed and ``rlfoundry resume`` runs the stage again. The actors end
with the stage.
"""

from __future__ import annotations

import os
from typing import Any

from rl_core.run.cluster import PlacementTimeout, Probe, cause, outcomes, place, probe_rendezvous, release
from rl_core.training.train_launch import TrainJobError, write_job


class _Rank(Probe):
    """One rank of the job, in a Ray actor's process (where it is and the rendezvous probe: ``Probe``)."""

    def run(self, store_root: str, job_uri: str, env: dict[str, str]) -> dict[str, Any]:
        """Join the job's process group with ``env`` (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*) and run it."""
        import ray

        from rl_core.training.train_launch import _rank

        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
        os.environ.update(env)
        if ray.get_gpu_ids():  # the one GPU Ray gave this actor is the only one it sees
            os.environ["RLFOUNDRY_DEVICE_INDEX"] = "0"
        _rank(store_root, job_uri)
        return {"rank": int(env["RANK"]), "pid": os.getpid()}


def rank_env(nodes: list[str], master: tuple[str, int]) -> list[dict[str, str]]:
    """Each rank's torch.distributed environment: LOCAL_RANK its index among the ranks of its node.

    >>> [e["LOCAL_RANK"] for e in rank_env(["a", "b", "a", "b"], ("10.0.0.1", 29500))]
    ['0', '0', '1', '1']
    """
    seen: dict[str, int] = {}
    out = []
    for r, node in enumerate(nodes):
        local = seen.get(node, 0)
        seen[node] = local + 1
        out.append(
            {
                "RANK": str(r),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(len(nodes)),
                "LOCAL_WORLD_SIZE": str(nodes.count(node)),
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
                "OMP_NUM_THREADS": "1",
            }
        )
    return out


def place_ranks(ctx: Any, what: str) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """``train.world_size`` rank actors placed as ``rl_core.run.cluster.place`` places them; a cluster that
    cannot place them in time fails ``what`` in one line."""
    try:
        return place(ctx, _Rank, what)
    except PlacementTimeout as e:
        raise TrainJobError(f"{e}; nothing committed") from None


def launch_train_on_ray(ctx: Any, job: Any) -> Any:
    """Run the train stage ``job`` as ``train.world_size`` Ray actors; its StageResult, whose metrics carry
    ``placement``: the Ray node and device of every rank."""
    from rl_core.artifacts.manifest import ArtifactRef
    from rl_core.artifacts.stage import StageResult

    gpu = bool(ctx.placement.trainer_gpus)
    job_uri, result_uri = write_job(ctx, job)
    pg, ranks, where = place_ranks(ctx, f"train stage of iteration {job.iteration}")
    try:
        if why := probe_rendezvous(ranks, where):
            raise TrainJobError(f"train stage of iteration {job.iteration}: {why}; nothing committed")
        envs = rank_env([w["node"] for w in where], (where[0]["address"], where[0]["port"]))
        if "RLFOUNDRY_FAULT" in os.environ:  # crash tests: the fault travels to the ranks' nodes
            envs = [{**e, "RLFOUNDRY_FAULT": os.environ["RLFOUNDRY_FAULT"]} for e in envs]
        runs = [a.run.remote(ctx.store.root, job_uri, e) for a, e in zip(ranks, envs, strict=True)]
        _wait(runs, where, job.iteration)
    finally:
        release(pg, ranks)
    result = ctx.store.read_json(result_uri)
    device = ctx.placement.workloads["trainer"].device
    placed = [
        {
            "rank": r,
            "node": w["node"],
            "address": w["address"],
            "device": "cuda:" + e["LOCAL_RANK"] if gpu else device,
        }
        for r, (w, e) in enumerate(zip(where, envs, strict=True))
    ]
    address = ctx.cfg.cluster.ray_address
    metrics = {**result["metrics"], "placement": {"ray_address": address, "train_ranks": placed}}
    outputs = {k: ArtifactRef.model_validate(v) for k, v in result["outputs"].items()}
    return StageResult(outputs=outputs, metrics=metrics, seeds=result["seeds"])


def _wait(runs: list[Any], where: list[dict[str, Any]], iteration: int, grace_s: float = 30.0) -> None:
    """Every rank's end. When one fails, the others get ``grace_s`` to end too (a lost rank's peers fail in
    their next collective), then the cause is named: a rank whose actor died (its node lost, its process
    killed) before any rank that merely failed after it, the lowest such rank: the same line whatever order
    the failures arrived in."""
    import ray

    pending = list(runs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            ray.wait(pending, num_returns=len(pending), timeout=grace_s)
            raise _cause(runs, where, iteration) from None


def _cause(runs: list[Any], where: list[dict[str, Any]], iteration: int) -> TrainJobError:
    r, how = cause(outcomes(runs)) or (0, "a Ray call failed and no rank names the cause")
    node = where[r]
    return TrainJobError(
        f"train stage of iteration {iteration}: rank {r} of {len(runs)} on Ray node {node['node'][:12]} "
        f"({node['address']}): {how}; nothing committed"
    )
