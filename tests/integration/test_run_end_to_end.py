"""`rlfoundry run` on the smoke config: each stage a Prefect task, artifacts in the store, lineage in
MLflow. The run (vLLM + DeepSpeed) is shared by the module: its stages replay in one process, and it is the
reference of the vLLM half of the crash matrix (a run killed at the points that involve vLLM and resumed ends
with its weights; the HF half is tests/integration/test_resume.py)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env, committed_stages, replay_cli, show_json
from tests.machine import fingerprint, pinned, same_machine

ROOT = Path(__file__).resolve().parents[2]


def _run(args, state, timeout=900, fresh=False):
    return cli(args, cli_env(state), timeout, fresh)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke run, in a new interpreter (`python -m flows.cli`, not a fork server's child): the program
    exactly as a user starts it."""
    state = tmp_path_factory.mktemp("state")
    r = _run(["run", "configs/smoke.yaml", "--run-id", "smoke-e2e"], state, fresh=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return state, r


@pytest.mark.slow
def test_run_prints_id_and_mlflow_command(smoke_run):
    _, r = smoke_run
    assert "run id: smoke-e2e" in r.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in r.stdout and "127.0.0.1" in r.stdout


@pytest.mark.slow
def test_show_json_has_base_and_every_stage(smoke_run):
    state, _ = smoke_run
    r = _run(["show", "smoke-e2e", "--json"], state, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["iterations_committed"] == 2
    base = data["base"]
    assert base["warmup"]["status"] == "committed" and "accuracy" in base["evaluate"]["metrics"]
    for it in data["iterations"]:
        for stage in ("generate", "execute_envs", "score_rewards", "train", "evaluate"):
            assert it["stages"][stage]["status"] == "committed", (it["iteration"], stage)
        ev = it["stages"]["evaluate"]["metrics"]
        assert 0.0 <= ev["accuracy"] <= 1.0 and "pass@4" in ev
        # policy_sha256 is the sha256 of the weights file train wrote
        ckpt = Path(it["stages"]["train"]["artifacts"]["checkpoint"].removeprefix("file://"))
        assert hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest() == it["policy_sha256"]
    assert data["iterations"][0]["policy_sha256"] != data["iterations"][1]["policy_sha256"]
    assert show_json(state, "smoke-e2e") == data  # the in-process form the other tests read
    table = _run(["show", "smoke-e2e"], state, timeout=120)
    assert table.returncode == 0 and "smoke-e2e" in table.stdout


# configs/smoke.yaml's base and per-iteration policy_sha256, recorded on the machine named in the file
# (tests/pinned/smoke_hashes.json: CPU model and the ISA its kernels dispatch on; tests/machine.py). The float
# kernels give other last bits on another CPU, so the pin is compared on that machine only; on every machine
# the run must reproduce itself (the crash chain below ends with these hashes, replay reproduces each stage).
# A change that moves them on the recording machine changes what a run computes: say so in the docs and
# record the new ones (`python -m tests.machine` prints the fingerprint).


@pytest.mark.slow
def test_smoke_run_keeps_its_pinned_policy_hashes(smoke_run):
    state, _ = smoke_run
    data = show_json(state, "smoke-e2e")
    hashes = [data["base"]["policy_sha256"]] + [it["policy_sha256"] for it in data["iterations"]]
    assert len(set(hashes)) == 3 and all(len(h) == 64 for h in hashes)  # every iteration moved the policy
    record = pinned("smoke_hashes")
    if not same_machine(record):
        pytest.skip(f"hashes pinned on {record['machine']}; this machine is {fingerprint()}")
    assert hashes == [record["base"], *record["iterations"]]


# The vLLM half of the crash matrix, chained: the run is killed at the first point, each resume is killed
# at the next one, the last resume finishes. Half-way through writing an artifact (iteration 1), right after a
# committed generate and before the weight sync into the engine (iteration 2: evaluate's sync of the new
# weights; generate 2 samples from the weights evaluate 1 already loaded).
VLLM_KILL_POINTS = ["write@1", "generate:committed@2", "sync@2"]


@pytest.mark.slow
def test_killed_vllm_run_resumes_to_identical_weights(smoke_run):
    state, _ = smoke_run  # the same state folder: the run shares the smoke run's warmed-up base model
    ref = show_json(state, "smoke-e2e")
    env = cli_env(state)
    args = ["run", "configs/smoke.yaml", "--run-id", "k"]
    committed: set[tuple[int, str]] = set()
    for point in VLLM_KILL_POINTS:
        killed = cli(args, {**env, "RLFOUNDRY_FAULT": point})
        assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr[-2000:])
        done = committed_stages(show_json(state, "k"))
        assert done >= committed, f"{point}: a stage committed before was lost"
        committed = done
        args = ["resume", "k"]
    resumed = _run(args, state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = show_json(state, "k")
    assert [it["policy_sha256"] for it in after["iterations"]] == [
        it["policy_sha256"] for it in ref["iterations"]
    ]
    assert after["base"]["policy_sha256"] == ref["base"]["policy_sha256"]
    acc = [[it["stages"]["evaluate"]["metrics"]["accuracy"] for it in d["iterations"]] for d in (after, ref)]
    assert acc[0] == acc[1]


@pytest.mark.slow
def test_rollouts_are_token_in_token_out(smoke_run):
    import pandas as pd

    state, _ = smoke_run
    run = state / "store" / "smoke-e2e" / "iter-0001"
    df = pd.read_parquet(run / "generate" / "rollouts.parquet")
    assert len(df) == 8 * 4
    assert all(
        len(c) == len(lp) == len(m)
        for c, lp, m in zip(df.completion_ids, df.logprobs, df.loss_mask, strict=True)
    )
    manifest = json.loads((run / "train" / "_manifest.json").read_text())
    assert set(manifest["inputs"]) >= {"policy", "rollouts", "rewards"}
    assert (
        manifest["inputs"]["rollouts"]["sha256"]
        == hashlib.sha256((run / "generate" / "rollouts.parquet").read_bytes()).hexdigest()
    )
    for key in ("config_hash", "code_version", "seeds", "timings", "metrics"):
        assert key in manifest
    assert (
        "logprob_mismatch_max" in manifest["metrics"] and manifest["metrics"]["logprob_mismatch_max"] < 1e-3
    )


@pytest.mark.slow
def test_mlflow_lineage(smoke_run):
    from mlflow.tracking import MlflowClient

    state, _ = smoke_run
    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlfoundry/smoke")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rlfoundry.run_id` = 'smoke-e2e'")
    parent = [r for r in runs if r.data.tags.get("rlfoundry.kind") == "experiment"]
    children = [r for r in runs if r.data.tags.get("rlfoundry.kind") == "iteration"]
    assert len(parent) == 1 and len(children) == 3  # base (iteration 0) + 2 iterations
    p = parent[0]
    assert p.data.params["train.lr"] and "prefect.flow_run_id" in p.data.tags
    it1 = next(c for c in children if c.data.tags["rlfoundry.iteration"] == "1")
    assert it1.data.tags["mlflow.parentRunId"] == p.info.run_id
    assert it1.data.tags["prefect.flow_run_id"]
    assert "train/loss" in it1.data.metrics and "evaluate/accuracy" in it1.data.metrics
    assert it1.data.tags["train.input.rollouts.uri"].endswith("iter-0001/generate/rollouts.parquet")
    arts = {a.path for a in client.list_artifacts(it1.info.run_id, "manifests")}
    assert "manifests/train.json" in arts


@pytest.mark.slow
def test_existing_run_id_is_refused(smoke_run):
    state, _ = smoke_run
    r = _run(["run", "configs/smoke.yaml", "--run-id", "smoke-e2e"], state, timeout=120)
    assert r.returncode != 0 and "already exists" in r.stderr


def test_bad_override_fails_before_any_work(tmp_path):
    r = _run(["run", "configs/smoke.yaml", "--set", "rollout.engine=nope"], tmp_path, timeout=120)
    assert r.returncode == 2
    assert "rollout.engine" in r.stderr and "'vllm'" in r.stderr
    assert not (tmp_path / "store").exists()


def test_cli_help_imports_nothing_heavy():
    code = (
        "import sys, flows.cli; "
        "heavy = {'torch', 'vllm', 'prefect', 'mlflow', 'deepspeed'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_fallback_engines_run_end_to_end(smoke_run):
    """The HF rollout engine and the plain-torch trainer go through the same flow."""
    args = [
        "run",
        "configs/smoke.yaml",
        "--run-id",
        "fallback",
        "--set",
        "rollout.engine=hf",
        "--set",
        "train.backend=torch",
        "--set",
        "experiment.iterations=1",
        "--set",
        "tracking.enabled=false",
    ]
    state, _ = smoke_run  # its warmed-up base model (the warm-up does not depend on the engines)
    r = _run(args, state)
    assert r.returncode == 0, r.stderr[-3000:]
    (it,) = show_json(state, "fallback")["iterations"]
    assert it["stages"]["train"]["metrics"]["logprob_mismatch_max"] < 1e-3
    assert it["stages"]["evaluate"]["status"] == "committed"


REPLAYED = ["generate", "execute_envs", "audit", "score_rewards", "train", "evaluate"]


@pytest.fixture(scope="module")
def replays(smoke_run):
    """Every stage of iteration 2 replayed by one `rlfoundry replay` process (its engines start once)."""
    state, _ = smoke_run
    r = replay_cli(state, "smoke-e2e", 2, REPLAYED)
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("stage", REPLAYED)
def test_replay_reproduces_every_stage(replays, stage):
    rc, data = replays
    report = data["stages"][stage]
    assert report["identical"] is True, report
    assert report["artifacts"] and all(a["identical"] for a in report["artifacts"].values())
    assert "/_replay/" in report["scratch"] and report["stage"] == stage and report["iteration"] == 2
    assert rc == 0 and data["identical"] is True


@pytest.mark.slow
def test_replay_refuses_a_corrupt_input(smoke_run):
    """A stored input whose bytes no longer match its manifest is reported with its path, never consumed."""
    import pandas as pd

    state, _ = smoke_run
    path = state / "store" / "smoke-e2e" / "iter-0001" / "execute_envs" / "env_results.parquet"
    original = path.read_bytes()
    try:
        df = pd.read_parquet(path)
        df.loc[0, "correct"] = not df.loc[0, "correct"]
        df.to_parquet(path, index=False)
        r = _run(
            ["replay", "smoke-e2e", "--iteration", "1", "--stage", "score_rewards", "--json"],
            state,
            timeout=300,
        )
        assert r.returncode == 2 and "corrupt" in r.stderr and "env_results.parquet" in r.stderr
    finally:
        path.write_bytes(original)


@pytest.mark.slow
def test_rollouts_command_shows_best_worst_random(smoke_run):
    state, _ = smoke_run
    r = _run(["rollouts", "smoke-e2e", "--iteration", "1", "-k", "2", "--json"], state, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert {len(data[k]) for k in ("best", "worst", "random")} == {2}
    assert data["best"][0]["reward"] >= data["worst"][0]["reward"]
    for row in data["best"] + data["random"]:
        assert {"prompt", "completion_text", "reward", "correct", "format", "env_well_formed"} <= set(row)
    table = _run(["rollouts", "smoke-e2e", "--iteration", "1"], state, timeout=120)
    assert table.returncode == 0 and "best" in table.stdout
    missing = _run(["rollouts", "smoke-e2e", "--iteration", "9"], state, timeout=120)
    assert missing.returncode == 2 and "no committed generate" in missing.stderr


@pytest.mark.slow
def test_lineage_walks_back_to_the_base_model(smoke_run):
    state, _ = smoke_run
    r = _run(["lineage", "smoke-e2e", "--iteration", "2", "--json"], state, timeout=120)
    assert r.returncode == 0, r.stderr
    chain = json.loads(r.stdout)
    assert [c["iteration"] for c in chain] == [2, 1, 0]
    assert chain[0]["parent_checkpoint"] == chain[1]["checkpoint"]
    assert chain[1]["parent_checkpoint"] == chain[2]["checkpoint"]
    assert chain[0]["rollouts"].endswith("iter-0002/generate/rollouts.parquet")
    shown = show_json(state, "smoke-e2e")
    assert chain[0]["policy_sha256"] == shown["iterations"][1]["policy_sha256"]
