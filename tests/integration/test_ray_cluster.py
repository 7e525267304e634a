"""The workloads on a Ray cluster of 3 nodes (issue 43): clusters started by the test on 127.0.0.1 inside a
network namespace of their own (Ray's servers listen on every interface), a head that runs the driver and no
work (0 CPUs) and two worker nodes of three (the benchmark's) or four (the scenario's) logical CPUs each.

First ``benchmarks/cluster.py --smoke`` (this suite's smoke of that benchmark): the same config on one machine
(torchrun, the 2 engines' shards dealt to one in-process engine) and on a cluster (train ranks, 2 rollout
engines and the environment workers as Ray actors and tasks), one iteration each; both end on one policy hash.
Then, on a cluster of its own: a run that asks for more than the cluster has is refused before any stage, in
one line naming what it has; a run loses rank 1's node (its raylet killed by the fault hook after rank 1's
update, a fixed point) in the train stage of iteration 1: the stage fails in one line naming the rank, its
node and the workload, nothing of it is committed; a node joins again and ``rlfoundry resume`` ends on the
one-machine hash. The manifests record where every workload ran: ranks and engines on two different nodes,
the environment chunks on the worker nodes; the weights synced to the engines through Ray. The scenario's
runs also score every rollout with a reward model served by a Ray actor (at weight 0, so the policy stays the
one-machine run's): its scores are transformers' own and its node is recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.cluster import ON_CLUSTER, run_args
from tests.conftest import cli, cli_env, python_in_private_netns, run_script
from tests.integration.test_reward_server import hf_scores

# 32 completions per iteration in mini-batches of 8 (4 optimizer steps), 2 ranks, 2 HF engines, one iteration
# (the suite's budget: the stage that loses its node is the one under test); the benchmark's own config.
RUN = [*run_args("hf"), *ON_CLUSTER, "--set", "experiment.iterations=1"]
STORE = "s3://rlf-test/runs"  # the cluster scenario's store: S3, which every node reaches
# The reward model on the cluster (a Ray actor) scores every rollout of the scenario's runs, at weight 0: its
# scores are stored and checked, and the policy stays the one-machine run's, which has no reward model.
WATCHED = ["--set", "reward.weights={correct: 1.0, format: 0.1, reward_model: 0.0}"]


def reward_folder(state: Path) -> Path:
    """A reward model folder (randomly initialised, scalar head, its own tokenizer), as ``rlfoundry
    reward-model train`` writes one."""
    from rl_core.models.model import build_tokenizer, save_checkpoint
    from rl_core.schema.config import load_config
    from rl_core.scoring.reward_model import build_reward_model

    cfg = load_config("configs/smoke.yaml")
    tok = build_tokenizer([f"{a}+{b}={a + b}" for a in range(100) for b in range(10)], cfg.model.vocab_size)
    return save_checkpoint(build_reward_model(cfg.model, tok, seed=5), tok, state / "rm")


def cluster_scenario(state: str, out: str) -> None:
    """In the private network namespace: an S3 server and a Prefect server (the runs' one, as ``rlfoundry up``
    gives them: not a private one each), the cluster (each worker node with scratch folders of its own), the
    refused run, the run on S3 that loses a node, the resume; what the test checks: ``out``."""
    import os

    from infra.localstack.prefect_server import health_url
    from infra.localstack.prefect_server import start as start_prefect
    from infra.localstack.s3_server import S3Server
    from infra.ray_local import local_cluster, node_scratch, private_env
    from rl_core.artifacts.paths import free_port
    from tests.conftest import S3_KEY, S3_SECRET

    scratch = Path(state) / "nodes"
    port = free_port()
    log = Path(state) / "logs" / f"prefect-server-{port}.log"
    prefect = start_prefect(port, Path(state) / "prefect-home", log, ui=False, tie_to_parent=True)
    prefect.wait_http(health_url(port), timeout_s=120)
    srv = S3Server.start(Path(state) / "weed", access_key=S3_KEY, secret_key=S3_SECRET)
    s3 = {
        "AWS_ENDPOINT_URL": srv.endpoint,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(s3)
    import s3fs

    s3fs.S3FileSystem().mkdir("rlf-test")
    try:
        rm = reward_folder(Path(state))
        with local_cluster(workers=2, cpus=4, scratch=scratch) as cluster:
            env = {
                **private_env(cli_env(Path(state))),
                **s3,
                "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            }
            args = [*RUN, "--set", f"cluster.ray_address={cluster.address}", "--set", f"store.uri={STORE}"]
            args += [*WATCHED, "--set", f"reward.model.path={rm}", "--set", "reward.model.batch_size=8"]
            # more ranks than the cluster has CPUs: refused before any stage, naming what it has
            short = cli(["run", *args, "--set", "train.world_size=4", "--run-id", "short"], env, fresh=True)
            fault = {**env, "RLFOUNDRY_FAULT": "train:rank1@1:node"}
            lost = cli(["run", *args, "--run-id", "lost"], fault, fresh=True)
            # a node back, as an autoscaler would, with scratch of its own too
            cluster.add_node(
                num_cpus=4, node_ip_address="127.0.0.1", env_vars=node_scratch(scratch, "node-2")
            )
            cluster.wait_for_nodes()
            resumed = cli(["resume", "lost", "--store", STORE], env, fresh=True)
            fs = s3fs.S3FileSystem()
            train = f"{STORE}/lost/iter-0001/train/_manifest.json"
            score = json.loads(fs.cat(f"{STORE}/lost/iter-0001/score_rewards/_manifest.json"))
            rollouts = pd.read_parquet(f"{STORE}/lost/iter-0001/generate/rollouts.parquet")
            scored = pd.read_parquet(score["outputs"]["rewards"]["uri"])
            result = {
                "score": score,
                "envs": json.loads(fs.cat(f"{STORE}/lost/iter-0001/execute_envs/_manifest.json")),
                "texts": [
                    p + c for p, c in zip(rollouts["prompt"], rollouts["completion_text"], strict=True)
                ],
                "reward_model": scored["reward_model"].tolist(),
                "rm": str(rm),
                "short": [short.returncode, short.stderr[-2000:]],
                "lost": [lost.returncode, lost.stdout[-2000:] + lost.stderr[-4000:]],
                "resumed": [resumed.returncode, resumed.stdout[-2000:] + resumed.stderr[-4000:]],
                "train": json.loads(fs.cat(train)) if fs.exists(train) else None,
                "address": cluster.address,
            }
    finally:
        srv.stop()
        prefect.stop()
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
        f"error: cluster.ray_address={got['address']}: the cluster has CPU 8 in all; train.world_size=4 "
        "ranks, rollout.servers=2 engines, task.env_workers=2 environment workers and the reward model's "
        "actor need 9 CPU (one CPU each): add nodes or lower them"
    )
    assert not (state / "store" / "short").exists()
    code_lost, text = got["lost"]
    assert code_lost != 0
    line = next((ln for ln in text.splitlines() if "train stage of iteration 1" in ln), "")
    assert "rank 1 of 2 on Ray node" in line and "its actor died" in line and "nothing committed" in line, (
        text
    )
    # The reward model ran as a Ray actor on a worker node and scored every rollout as transformers does.
    placed = got["score"]["metrics"]["placement"]
    assert placed["ray_address"] == got["address"] and placed["reward_model"]["device"] == "cpu", placed
    workers = {c["node"] for c in got["envs"]["metrics"]["placement"]["env_workers"]}  # the worker nodes
    assert placed["reward_model"]["node"] in workers, (placed, workers)
    assert got["score"]["metrics"]["reward_model_requests"] == 4  # 32 completions in batches of 8
    ref = hf_scores(Path(got["rm"]), got["texts"])
    assert len(ref) == 32 and max(abs(a - b) for a, b in zip(got["reward_model"], ref, strict=True)) < 1e-4
    code_resumed, text = got["resumed"]
    assert code_resumed == 0, text

    train = got["train"]  # the resumed train stage's manifest, read from S3
    assert train is not None
    assert train["metrics"]["policy_sha256"] == figures["one_machine"]["policy_sha256"]  # as on one machine
    placed = train["metrics"]["placement"]
    assert placed["ray_address"] == got["address"]
    ranks = placed["train_ranks"]
    assert [p["rank"] for p in ranks] == [0, 1] and {p["device"] for p in ranks} == {"cpu"}
    assert len({p["node"] for p in ranks}) == 2, ranks
    # Each worker node kept its scratch apart: the engines' policy folders and the checkpoints the ranks
    # fetched from S3 are in each node's own folders, not the driver's.
    nodes = sorted((state / "nodes").iterdir())
    assert [n.name for n in nodes] == ["node-0", "node-1", "node-2"]
    for n in nodes:
        engines = list((n / "tmp").glob("rlfoundry-engine-*/config.json"))
        fetched = list((n / "cache" / "rlfoundry" / "checkpoints").glob("*/config.json"))
        assert engines or fetched, f"{n.name}: nothing in its own scratch"
    assert sum(len(list((n / "tmp").glob("rlfoundry-engine-*"))) for n in nodes) >= 4  # 2 engines, 2 runs
    # the reward model's folder went to its actor through Ray, into its node's scratch: one actor held by the
    # lost run across its stages, one by the resumed run (its evaluate stage scores with it too)
    assert sum(len(list((n / "tmp").glob("rlfoundry-reward-*/config.json"))) for n in nodes) == 2
