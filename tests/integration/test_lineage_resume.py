"""Lineage off the step's path (``tracking.writes: process``, a writer process) loses nothing to a kill -9:
the flow killed after iteration 1 was committed, before its records went to the writer, and ``rlfoundry
resume`` writes them: the iteration's MLflow run with its stage metrics and manifests, MLflow's own lineage of
its train stage (dataset inputs, the logged model, once), and the summary on the experiment's run."""

from __future__ import annotations

import pytest

from tests.conftest import cli, cli_env

SMOKE = ["configs/smoke.yaml", *("--set", "rollout.engine=hf", "--set", "eval.every=100")]
SMOKE += ["--set", "tracking.writes=process"]


@pytest.mark.slow
def test_a_kill_between_the_commit_and_the_lineage_write_is_written_by_the_resume(tmp_path):
    env = cli_env(tmp_path)
    env["RLFOUNDRY_FAULT"] = "lineage:close@1"
    killed = cli(["run", *SMOKE, "--run-id", "lin"], env, 600)
    assert killed.returncode != 0
    env.pop("RLFOUNDRY_FAULT")
    resumed = cli(["resume", "lin"], env, 600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "rlfoundry/smoke"]
    runs = {r.data.tags.get("rlfoundry.iteration"): r for r in client.search_runs([exp.experiment_id])}
    one = runs["1"]
    assert one.info.status == "FINISHED"
    assert {"generate/seconds", "train/seconds", "train/loss"} <= set(one.data.metrics)
    assert one.data.tags["train.checkpoint.uri"].endswith("iter-0001/train/checkpoint")
    names = sorted(d.dataset.name for d in client.get_run(one.info.run_id).inputs.dataset_inputs)
    assert names == ["rewards-iter-0001", "rollouts-iter-0001"]
    models = client.search_logged_models([exp.experiment_id], filter_string="name = 'policy-lin-iter-0001'")
    assert len(models) == 1 and models[0].source_run_id == one.info.run_id
    manifests = {a.path for a in client.list_artifacts(one.info.run_id, "manifests")}
    assert "manifests/train.json" in manifests
    parent = next(r for r in runs.values() if r.data.tags.get("rlfoundry.kind") == "experiment")
    steps = {m.step for m in client.get_metric_history(parent.info.run_id, "mean_reward")}
    assert steps == {1, 2}
