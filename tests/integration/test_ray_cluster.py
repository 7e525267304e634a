"""The workloads on a Ray cluster of 3 nodes (issue 43): clusters started by the test on 127.0.0.1 inside a
network namespace of their own (Ray's servers listen on every interface), a head that runs the driver and no
work (0 CPUs) and two worker nodes of two logical CPUs each.

First ``benchmarks/cluster.py --smoke`` (this suite's smoke of that benchmark): the same config on one machine
(torchrun, the 2 engines' shards dealt to one in-process engine) and on a cluster (train ranks, 2 rollout
engines and the environment workers as Ray actors and tasks), one iteration each; both end on one policy hash.
Then, on a cluster of its own: a run that asks for more than the cluster has is refused before any stage, in
one line naming what it has; a run loses rank 1's node (its raylet killed by the fault hook after rank 1's
update, a fixed point) in the train stage of iteration 1: the stage fails in one line naming the rank, its
node and the workload, nothing of it is committed; a node joins again and ``rlfoundry resume`` ends on the
one-machine hash. The manifests record where every workload ran: ranks and engines on two different nodes,
the environment chunks on the worker nodes; the weights synced to the engines through Ray.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cluster import ON_CLUSTER
from benchmarks.cluster import RUN as BENCH_RUN
from tests.conftest import cli, cli_env, python_in_private_netns, run_script, show_json

# 32 completions per iteration in mini-batches of 8 (4 optimizer steps), 2 ranks, 2 HF engines, one iteration
# (the suite's budget: the stage that loses its node is the one under test); the benchmark's own config.
RUN = [*BENCH_RUN, *ON_CLUSTER, "--set", "experiment.iterations=1"]


def cluster_scenario(state: str, out: str) -> None:
    """In the private network namespace: the cluster, the run that loses a node, the resume."""
    from infra.ray_local import local_cluster, private_env

    with local_cluster(workers=2, cpus=2) as cluster:
        env = private_env(cli_env(Path(state)))
        args = [*RUN, "--set", f"cluster.ray_address={cluster.address}"]
        # more ranks than the cluster has CPUs: refused before any stage, naming what it has
        short = cli(["run", *args, "--set", "train.world_size=3", "--run-id", "short"], env, fresh=True)
        lost = cli(
            ["run", *args, "--run-id", "lost"], {**env, "RLFOUNDRY_FAULT": "train:rank1@1:node"}, fresh=True
        )
        cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")  # a node back, as an autoscaler would
        cluster.wait_for_nodes()
        resumed = cli(["resume", "lost"], env, fresh=True)
        result = {
            "short": [short.returncode, short.stderr[-2000:]],
            "lost": [lost.returncode, lost.stdout[-2000:] + lost.stderr[-4000:]],
            "resumed": [resumed.returncode, resumed.stdout[-2000:] + resumed.stderr[-4000:]],
            "address": cluster.address,
        }
        Path(out).write_text(json.dumps(result))


@pytest.mark.slow
def test_workloads_on_a_three_node_cluster_survive_a_lost_node_and_match_one_machine(tmp_path):
    state = tmp_path / "state"
    bench = run_script("benchmarks/cluster.py", ["--smoke", "--json"], cli_env(state), timeout=900)
    assert bench.returncode == 0, bench.stderr[-4000:]
    figures = json.loads(bench.stdout.strip().splitlines()[-1])
    assert figures["smoke"] is True and figures["same_policy"] is True, figures
    assert isinstance(figures["ratio"], float) and figures["median_weight_sync_s"] > 0, figures
    clean = figures["cluster"]["placement"]
    engines = clean["generate"]["rollout_engines"]
    assert [e["engine"] for e in engines] == ["hf", "hf"] and len({e["node"] for e in engines}) == 2, engines
    ranks = clean["train"]["train_ranks"]
    assert len({r["node"] for r in ranks}) == 2, ranks  # spread: one rank per worker node
    chunks = clean["execute_envs"]["env_workers"]
    assert {c["node"] for c in chunks} == {r["node"] for r in ranks}, chunks  # the worker nodes, not the head
    assert sum(c["rows"] for c in chunks) == 32 and [c["chunk"] for c in chunks] == list(range(len(chunks)))
    one, on_cluster = (state / "store" / r / "iter-0001" for r in ("one", "cluster"))
    for stage in ("generate", "execute_envs"):  # the tables themselves, byte for byte, wherever they ran
        outs = [json.loads((d / stage / "_manifest.json").read_text())["outputs"] for d in (one, on_cluster)]
        assert {k: v["sha256"] for k, v in outs[0].items()} == {k: v["sha256"] for k, v in outs[1].items()}

    out = tmp_path / "cluster.json"
    code = (
        "from tests.integration.test_ray_cluster import cluster_scenario as f; "
        f"f({str(state)!r}, {str(out)!r})"
    )
    r = python_in_private_netns(code, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(out.read_text())
    code_short, text = got["short"]
    assert code_short == 2, text
    assert text.strip().splitlines()[-1] == (
        f"error: cluster.ray_address={got['address']}: the cluster has CPU 4 in all; "
        "train.world_size=3 ranks and rollout.servers=2 engines need 5 CPU (one CPU each): add nodes or "
        "lower them"
    )
    assert not (state / "store" / "short").exists()
    code_lost, text = got["lost"]
    assert code_lost != 0
    line = next((ln for ln in text.splitlines() if "train stage of iteration 1" in ln), "")
    assert "rank 1 of 2 on Ray node" in line and "its actor died" in line and "nothing committed" in line, (
        text
    )
    code_resumed, text = got["resumed"]
    assert code_resumed == 0, text

    run = state / "store" / "lost"
    shown = show_json(state, "lost")
    hashes = [it["policy_sha256"] for it in shown["iterations"]]
    assert hashes == [figures["one_machine"]["policy_sha256"]]  # the same policy as on one machine
    m = json.loads((run / "iter-0001" / "train" / "_manifest.json").read_text())
    placed = m["metrics"]["placement"]
    assert placed["ray_address"] == got["address"]
    ranks = placed["train_ranks"]
    assert [p["rank"] for p in ranks] == [0, 1] and {p["device"] for p in ranks} == {"cpu"}
    assert len({p["node"] for p in ranks}) == 2, ranks
