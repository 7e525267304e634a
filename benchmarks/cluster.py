"""The same run on one machine and on a Ray cluster of 3 nodes on this machine, side by side: what the
cluster path costs (issue 43).

    .venv/bin/python benchmarks/cluster.py --json [--iterations 3] [--out benchmarks/results/cluster.json]

Both arms run configs/smoke.yaml's shape with 2 train ranks (32 completions, 4 optimizer steps a stage) and 2
rollout engines (``rollout.servers=2``, the HF engine) from one shared base model. "one_machine" launches each
train stage with torchrun and deals the 2 engines' shards to its one in-process engine; "cluster" runs on a
cluster this script starts in a network namespace of its own (``unshare --net``, loopback only: Ray's servers
listen on every interface), a head running the driver and two worker nodes of two logical CPUs each: the
train ranks, the 2 engines (Ray actors living across iterations, weights synced through Ray's object store
after every update) and the environment workers (``task.executor=ray``) all on the worker nodes. Recorded
per arm: seconds per iteration (the stages' sum), of the train and generate stages, per iteration, the final
policy hash (the two arms must end on the same one) and, on the cluster, the weight sync to the 2 engines
(seconds, per iteration) and where every workload ran. ``ratio``: one machine's seconds per iteration over
the cluster's (higher is better; below 1 is the cluster path's overhead here, where every node shares the
same two cores).

``--engine vllm``: the engines are vLLM (on one machine 2 vLLM servers, on the cluster 2 actors each holding
vLLM in-process) -> ``benchmarks/results/cluster_vllm.json``. ``tests/integration/test_ray_cluster.py`` runs
this script's ``--smoke`` (HF engines) as its uninterrupted arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, add_smoke_flag, finish, python, result_file  # noqa: E402

RUN = [
    "configs/smoke.yaml",
    *("--set", "train.micro_batch_size=8", "--set", "tracking.enabled=false"),
    *("--set", "train.world_size=2", "--set", "rollout.servers=2"),
]  # with the engines' kind: run_args
ON_CLUSTER = ["--set", "task.executor=ray"]  # the environment workers on the cluster too


RESULTS = {"hf": "cluster.json", "vllm": "cluster_vllm.json"}


def run_args(engine: str) -> list[str]:
    """The benchmark's run with rollout engines of kind ``engine`` (hf: the default; vllm: on one machine 2
    vLLM servers, on the cluster 2 actors each holding vLLM)."""
    return [*RUN, "--set", f"rollout.engine={engine}"]


def _run(args: list[str], env: dict[str, str], fresh: bool = False) -> None:
    done = (
        subprocess.run(
            [sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if fresh
        else python(["-m", "flows.cli", *args], env)
    )
    if done.returncode != 0:
        raise SystemExit(f"rlfoundry {' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")


def _figures(env: dict[str, str], run_id: str) -> dict[str, object]:
    done = python(["-m", "flows.cli", "show", run_id, "--json"], env)
    data = json.loads(done.stdout)
    its = data["iterations"]

    def seconds(stage: str) -> list[float]:
        return [round(it["stages"][stage]["seconds"], 2) for it in its]

    total = [sum(s["seconds"] for s in it["stages"].values() if s.get("seconds")) for it in its]
    last = its[-1]["stages"]
    syncs = [it["stages"]["generate"]["metrics"].get("weight_sync_s") for it in its]
    return {
        "iteration_s": [round(t, 2) for t in total],
        "train_s": seconds("train"),
        "generate_s": seconds("generate"),
        "median_iteration_s": round(statistics.median(total), 2),
        "median_train_s": round(statistics.median(seconds("train")), 2),
        "weight_sync_s": syncs if any(s is not None for s in syncs) else None,
        "policy_sha256": its[-1]["policy_sha256"],
        "placement": {
            stage: last[stage]["metrics"].get("placement") for stage in ("train", "generate", "execute_envs")
        },
    }


def cluster_arm(state: str, iterations: int, out: str, engine: str = "hf") -> None:
    """Inside the private network namespace: the cluster, the run on it, its figures to ``out``."""
    from infra.ray_local import local_cluster, private_env

    with local_cluster(workers=2, cpus=3) as cluster:
        env = private_env({**os.environ, "RLFOUNDRY_STATE_DIR": state})
        args = ["run", *run_args(engine), *ON_CLUSTER, "--set", f"experiment.iterations={iterations}"]
        _run(
            [*args, "--set", f"cluster.ray_address={cluster.address}", "--run-id", "cluster"], env, fresh=True
        )
        Path(out).write_text(json.dumps(_figures(env, "cluster")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="the rollout engines' kind")
    ap.add_argument("--cluster-arm", nargs=3, metavar=("STATE", "ITERATIONS", "OUT"), help=argparse.SUPPRESS)
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.cluster_arm:
        cluster_arm(args.cluster_arm[0], int(args.cluster_arm[1]), args.cluster_arm[2], args.engine)
        return
    iterations = 1 if args.smoke else args.iterations
    state = os.environ.get("RLFOUNDRY_STATE_DIR") or tempfile.mkdtemp(prefix="rlf-bench-cluster-")
    env = {**os.environ, "RLFOUNDRY_STATE_DIR": state}
    one = ["run", *run_args(args.engine), "--set", f"experiment.iterations={iterations}", "--run-id", "one"]
    _run(one, env)
    local = _figures(env, "one")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cluster.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--cluster-arm",
            state,
            str(iterations),
            str(out),
            "--engine",
            args.engine,
        ]
        netns = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
        done = subprocess.run(
            netns, cwd=ROOT, capture_output=True, text=True, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}
        )
        if done.returncode != 0:
            raise SystemExit(f"the cluster arm failed:\n{done.stderr[-3000:]}")
        cluster = json.loads(out.read_text())
    result = {
        "benchmark": "cluster",
        "engine": args.engine,
        "iterations": iterations,
        "one_machine": local,
        "cluster": cluster,
        "same_policy": local["policy_sha256"] == cluster["policy_sha256"],
        "engines": 2,
        "median_weight_sync_s": round(statistics.median(cluster["weight_sync_s"]), 4),
        "ratio": round(local["median_iteration_s"] / cluster["median_iteration_s"], 3),
    }
    finish(
        result,
        result_file(args.out, ROOT / f"benchmarks/results/{RESULTS[args.engine]}", args.smoke),
        args.json,
        args.smoke,
    )


if __name__ == "__main__":
    main()
