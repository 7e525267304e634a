"""MLflow's own lineage of a run (an MLflow SQLite database in a temporary folder, no server): the update's
rollouts and rewards as dataset inputs, its checkpoint as a logged model, and the final policy promoted in the
model registry, never twice, the ``champion`` alias on the best held-out accuracy."""

from __future__ import annotations

import pytest

from rl_core.artifacts.manifest import ArtifactRef, Manifest, Timings
from rl_core.run.lineage import Lineage
from rl_core.schema.config import load_config


@pytest.fixture(scope="module")
def lin(tmp_path_factory):
    """One MLflow database for the module (creating one costs seconds)."""
    tmp = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLFOUNDRY_STATE_DIR", str(tmp))
        yield Lineage.open(load_config("configs/smoke.yaml", [f"tracking.mlflow_uri=sqlite:///{tmp}/m.db"]))


def _ckpt(n: int) -> ArtifactRef:
    return ArtifactRef(
        uri=f"file:///store/r/iter-{n:04d}/train/checkpoint", sha256=f"{n:064x}", files={"a": "b" * 64}
    )


def _train(k: int, reused: bool = False) -> Manifest:
    def table(name: str, n: int) -> ArtifactRef:
        return ArtifactRef(uri=f"file:///store/r/iter-{k:04d}/{name}.parquet", sha256=f"{n:064x}", rows=32)

    return Manifest(
        run_id="r", iteration=k, stage="train", config_hash="h", code_version="c", reused=reused,
        inputs={"rollouts": table("generate/rollouts", 1), "rewards": table("score_rewards/rewards", 2),
                "policy": _ckpt(k - 1)},
        outputs={"checkpoint": _ckpt(k)}, metrics={"policy_sha256": "ff" * 32},
        timings=Timings(seconds=1.0, started_at=0.0),
    )  # fmt: skip


def test_the_update_reads_datasets_and_writes_a_logged_model(lin):
    run = lin.client.create_run(lin.experiment_id).info.run_id
    lin.log_stage(run, _train(1))
    lin.log_stage(run, _train(1, reused=True))  # a resume finds it: nothing logged twice
    inputs = lin.client.get_run(run).inputs.dataset_inputs
    assert sorted(d.dataset.name for d in inputs) == ["rewards-iter-0001", "rollouts-iter-0001"]
    assert all("file:///store/r/iter-0001/" in d.dataset.source for d in inputs)
    models = lin.client.search_logged_models([lin.experiment_id])
    assert [m.name for m in models] == ["policy-r-iter-0001"]
    assert models[0].tags["store_uri"] == _ckpt(1).uri and models[0].source_run_id == run


def test_a_resumed_stage_whose_lineage_was_never_written_gets_it(lin):
    """Killed after iteration 2 was committed, before its records were written: the resume finds the stage
    committed (reused) and writes MLflow's lineage it lacks, once."""
    run = lin.client.create_run(lin.experiment_id).info.run_id
    lin.log_stage(run, _train(2, reused=True))
    lin.log_stage(run, _train(2, reused=True))  # resumed twice: still once
    inputs = lin.client.get_run(run).inputs.dataset_inputs
    assert sorted(d.dataset.name for d in inputs) == ["rewards-iter-0002", "rollouts-iter-0002"]
    models = lin.client.search_logged_models([lin.experiment_id], filter_string="name = 'policy-r-iter-0002'")
    assert len(models) == 1 and models[0].source_run_id == run


def test_promotion_registers_once_and_moves_the_champion_only_up(lin):
    v1 = lin.promote("rlfoundry-smoke", "r", 5, _ckpt(5), {"accuracy": 0.5})
    assert (
        lin.promote("rlfoundry-smoke", "r", 5, _ckpt(5), {"accuracy": 0.5}) == v1
    )  # resumed, finished again
    v2 = lin.promote("rlfoundry-smoke", "s", 5, _ckpt(6), {"accuracy": 0.25})  # a worse policy
    alias = lambda a: lin.client.get_model_version_by_alias("rlfoundry-smoke", a)  # noqa: E731
    assert alias("newest").version == v2 and alias("champion").version == v1
    v3 = lin.promote("rlfoundry-smoke", "t", 5, _ckpt(7), {"accuracy": 0.75})
    assert alias("champion").version == v3 and alias("champion").source == _ckpt(7).uri
    assert alias("champion").tags["rlfoundry.run_id"] == "t"
    assert len(lin.client.search_model_versions("name='rlfoundry-smoke'")) == 3


def test_iteration_runs_are_searched_once_per_run_and_found_again_after_a_restart(lin, monkeypatch):
    """A run's iteration runs: one search in a process, the runs it creates kept; a new process (a resume)
    finds each one again instead of creating a second, even past a page of search results."""
    parent = lin.client.create_run(lin.experiment_id).info.run_id
    searches: list[str] = []
    search = lin.client.search_runs
    monkeypatch.setattr(
        lin.client, "search_runs", lambda *a, **k: searches.append(k["filter_string"]) or search(*a, **k)
    )
    made = {k: lin.iteration_run(parent, "paged", k) for k in range(1, 6)}
    assert len(set(made.values())) == 5 and len(searches) == 1
    assert lin.iteration_run(parent, "paged", 3) == made[3] and len(searches) == 1
    restarted = Lineage(lin.client, lin.experiment_id)
    monkeypatch.setattr(
        lin.client,
        "search_runs",
        lambda *a, **k: searches.append("x") or search(*a, **{**k, "max_results": 2}),
    )  # pages of two: the search must follow the page token
    assert {k: restarted.iteration_run(parent, "paged", k, "flow-2") for k in range(1, 7)} == made | {
        6: restarted.iteration_run(parent, "paged", 6)
    }
    assert searches.count("x") == 3  # one search, in three pages
    assert lin.client.get_run(made[2]).data.tags["prefect.flow_run_id"] == "flow-2"


def _iteration(k: int, alarms: list[dict]) -> dict[str, Manifest]:
    def stage(name: str, metrics: dict) -> Manifest:
        return Manifest(
            run_id="win", iteration=k, stage=name, inputs={}, outputs={}, config_hash="h", code_version="c",
            metrics=metrics, timings=Timings(seconds=0.1, started_at=0.0),
        )  # fmt: skip

    vitals = {"kl": 0.01 * k, "reward_std": 0.5, "alarms": len(alarms), "alarm_list": alarms}
    return {
        "score_rewards": stage("score_rewards", {"mean_reward": k / 10}),
        "vitals": stage("vitals", vitals),
    }


def test_iteration_summaries_within_the_window_go_to_the_parent_run_in_one_call(lin, monkeypatch):
    """tracking.summary_every_s: the first iteration's row at once, then the rows of the iterations that end
    within the window in one call, an alarm's and the last one's at once; every iteration's row charted."""
    from flows.experiment import _report
    from flows.observe import RecordWindow
    from rl_core.artifacts.report import subscribe
    from rl_core.run.lineage_jobs import lineage

    uri = lin.client.tracking_uri
    cfg = load_config("configs/smoke.yaml", [f"tracking.mlflow_uri={uri}", "experiment.iterations=7"])
    mine = lineage(cfg)
    parent = mine.experiment_run("win", cfg, "base")
    calls: list[list[int]] = []
    log_batch = mine.client.log_batch

    def counted(run: str, **kw):
        if run == parent:
            calls.append(sorted({m.step for m in kw["metrics"]}))
        return log_batch(run, **kw)

    monkeypatch.setattr(mine.client, "log_batch", counted)
    tables: list[list[int]] = []
    stop = subscribe(lambda ev: tables.append([s["iteration"] for s in ev["tables"]]))
    warn = {"name": "kl_spike", "action": "warn", "message": "KL high", "value": 1.0, "threshold": 0.1}
    window = RecordWindow(10.0, iter([0.0, 1.0, 2.0, 3.0, 4.0, 20.0, 21.0]).__next__)
    try:
        for k in range(1, 8):
            _report(cfg, "win", parent, k, _iteration(k, [warn] if k == 3 else []), None, window)
    finally:
        stop()
    # 1 at once; 2-3 with 3's alarm; 4-6 when the window passed at 6; 7, the last, at once
    assert calls == [[1], [2, 3], [4, 5, 6], [7]] and tables == [[1], [], [2, 3], [], [], [4, 5, 6], [7]]
    history = mine.client.get_metric_history(parent, "mean_reward")
    assert sorted((m.step, m.value) for m in history) == [(k, k / 10) for k in range(1, 8)]
    assert {m.step for m in mine.client.get_metric_history(parent, "alarms")} == set(range(1, 8))
