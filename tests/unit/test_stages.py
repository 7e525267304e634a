"""The stage table: what each stage reads (and from which policy version), resolved from committed manifests;
the table is consistent with itself; a manifest is a typed record."""

from __future__ import annotations

import hashlib
import json

import pytest

from rl_core.artifacts.manifest import ArtifactRef, Manifest, Timings
from rl_core.artifacts.store import ArtifactError, Store
from rl_core.pipeline.stages import ITERATION_STAGES, STAGES, TABLE, resolve_inputs
from rl_core.schema.config import load_config


def _manifest(stage: str, k: int) -> Manifest:
    outs = {
        o: ArtifactRef(
            uri=f"s3://b/{stage}@{k}/{o}", sha256=hashlib.sha256(f"{stage}{k}{o}".encode()).hexdigest()
        )
        for o in STAGES[stage].outputs
    }
    return Manifest(
        run_id="r",
        iteration=k,
        stage=stage,
        inputs={},
        outputs=outs,
        config_hash="c",
        code_version="v",
        timings=Timings(seconds=1.0, started_at=0.0),
    )


def _lookup(committed: set[tuple[str, int]]):
    return lambda s, k: _manifest(s, k) if (s, k) in committed else None


def _uris(refs: dict[str, ArtifactRef]) -> dict[str, str]:
    return {name: ref.uri.removeprefix("s3://b/") for name, ref in refs.items()}


ALL = {(s, 0) for s in ("init", "warmup")} | {(s, k) for s in ITERATION_STAGES for k in (1, 2, 3)}


def test_the_first_iteration_starts_from_the_warmed_up_base_model():
    cfg = load_config("configs/smoke.yaml")
    assert _uris(resolve_inputs(STAGES["generate"], cfg, 1, _lookup(ALL))) == {
        "policy": "warmup@0/checkpoint"
    }
    # no optimizer state before the first update; no reference model without a KL term
    assert _uris(resolve_inputs(STAGES["train"], cfg, 1, _lookup(ALL))) == {
        "policy": "warmup@0/checkpoint",
        "rollouts": "generate@1/rollouts",
        "rewards": "score_rewards@1/rewards",
    }
    assert _uris(resolve_inputs(STAGES["evaluate"], cfg, 0, _lookup(ALL))) == {
        "policy": "warmup@0/checkpoint"
    }


def test_later_iterations_read_the_previous_policy_version():
    cfg = load_config("configs/smoke.yaml", ["train.kl_coef=0.05"])
    assert _uris(resolve_inputs(STAGES["train"], cfg, 3, _lookup(ALL))) == {
        "policy": "train@2/checkpoint",
        "optimizer": "train@2/optimizer",
        "reference": "warmup@0/checkpoint",
        "rollouts": "generate@3/rollouts",
        "rewards": "score_rewards@3/rewards",
    }
    assert _uris(resolve_inputs(STAGES["evaluate"], cfg, 2, _lookup(ALL))) == {"policy": "train@2/checkpoint"}
    assert _uris(resolve_inputs(STAGES["score_rewards"], cfg, 2, _lookup(ALL))) == {
        "rollouts": "generate@2/rollouts",
        "env_results": "execute_envs@2/env_results",
        "audit": "audit@2/flags",
    }
    # the audit reads the previous iteration's state (the rates its alarms compare with); none at first
    assert _uris(resolve_inputs(STAGES["audit"], cfg, 2, _lookup(ALL)))["state"] == "audit@1/state"
    assert "state" not in resolve_inputs(STAGES["audit"], cfg, 1, _lookup(ALL))
    off = load_config("configs/smoke.yaml", ["reward.audit.enabled=false"])
    assert "audit" not in resolve_inputs(STAGES["score_rewards"], off, 2, _lookup(ALL))
    assert not STAGES["audit"].due(off, 2)


def test_a_missing_upstream_stage_is_named():
    cfg = load_config("configs/smoke.yaml")
    with pytest.raises(
        RuntimeError, match=r"train at iteration 2 reads score_rewards\.rewards of iteration 2"
    ):
        resolve_inputs(STAGES["train"], cfg, 2, _lookup(ALL - {("score_rewards", 2)}))


def test_the_table_is_consistent():
    names = [s.name for s in TABLE]
    assert len(set(names)) == len(names)
    for spec in TABLE:
        for src in spec.inputs.values():
            assert src.output in STAGES[src.stage].outputs, (spec.name, src)
            if src.initial:
                assert src.initial[1] in STAGES[src.initial[0]].outputs
            # a stage reads only what is written before it (earlier in the table, or an earlier iteration)
            assert src.offset < 0 or names.index(src.stage) < names.index(spec.name), (spec.name, src)
        assert spec.doc and callable(spec.body)


def test_evaluation_is_due_as_configured():
    cfg = load_config("configs/smoke.yaml", ["eval.every=3", "experiment.iterations=7"])
    assert [k for k in range(8) if STAGES["evaluate"].due(cfg, k)] == [0, 3, 6, 7]


def test_a_manifest_missing_a_field_is_reported_corrupt(tmp_path):
    store = Store(str(tmp_path))
    uri = store.stage_uri("r", 1, "train")
    m = _manifest("train", 1)
    store.write_manifest(uri, m)
    assert store.read_manifest(uri) == m
    data = m.model_dump(mode="json")
    del data["outputs"]["checkpoint"]["sha256"]
    (tmp_path / "r" / "iter-0001" / "train" / "_manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"manifest corrupt: .*/r/iter-0001/train/_manifest\.json"):
        store.read_manifest(uri)


@pytest.mark.parametrize("staleness", [1, 2])
def test_asynchronous_generate_samples_a_fixed_older_policy(staleness):
    """rollout.max_staleness K: generate k reads the policy of k-1-K (the warm-up checkpoint before that
    exists), nothing later, so it never waits for the train stages it runs beside; train keeps the newest."""
    cfg = load_config("configs/smoke.yaml", [f"rollout.max_staleness={staleness}"])
    # only what is committed while train k-1 still runs: train up to k-2, rollouts up to k
    for k in (1, 2, 3, 4):
        committed = {("init", 0), ("warmup", 0)} | {("train", j) for j in range(1, k - 1)}
        want = f"train@{k - 1 - staleness}/checkpoint" if k - 1 - staleness >= 1 else "warmup@0/checkpoint"
        assert _uris(resolve_inputs(STAGES["generate"], cfg, k, _lookup(committed))) == {"policy": want}
    assert _uris(resolve_inputs(STAGES["train"], cfg, 3, _lookup(ALL)))["policy"] == "train@2/checkpoint"


def test_an_unstored_checkpoint_no_train_stage_made_is_an_error_naming_it(tmp_path):
    """A reference marked ``stored: false`` is rebuilt from the train stage that made it; with none committed
    (a hand-edited manifest, another run's reference) the error names the checkpoint and the run."""
    from rl_core.run.context import RunContext

    cfg = load_config(None, [f"store.uri={tmp_path}", "train.checkpoint_every=2"])
    ctx = RunContext(cfg, "r")
    ref = ArtifactRef(
        uri=f"{tmp_path}/r/iter-0001/train/checkpoint",
        sha256="f" * 64,
        files={"model.safetensors": "e" * 64},
        stored=False,
    )
    with pytest.raises(ArtifactError, match=r"iter-0001/train/checkpoint was not stored .* run r"):
        ctx.local_checkpoint(ref)
    assert ArtifactRef.model_validate(ref.model_dump()).stored is False  # the flag survives the manifest


@pytest.mark.parametrize(
    "body",
    ["null", "[]", "7", "1" * 5000, "[" * 100_000 + "]" * 100_000],
    ids=["null", "list", "number", "5000-digit", "deep"],
)
def test_a_committed_stage_whose_manifest_is_not_an_object_is_refused_and_kept(tmp_path, body):
    """A manifest of JSON ``null`` read as "not committed yet" let the stage be cleared and run again over its
    committed output; numbers and nesting past Python's limits raised without the file's name."""
    import pandas as pd

    from rl_core.artifacts.stage import StageResult, run_stage

    store = Store(str(tmp_path))

    def body_writing(value: str):
        def body_fn(job):
            ref = store.write_table(job.out_uri + "/rollouts.parquet", pd.DataFrame({"v": [value]}))
            return StageResult(outputs={"rollouts": ref})

        return body_fn

    run_stage(store, "r", 1, "generate", "h1", {}, body_writing("committed"))
    folder = tmp_path / "r" / "iter-0001" / "generate"
    (folder / "_manifest.json").write_text(body)
    again = Store(str(tmp_path))
    with pytest.raises(ArtifactError, match=r"manifest corrupt: .*/r/iter-0001/generate/_manifest\.json"):
        run_stage(again, "r", 1, "generate", "h1", {}, body_writing("recomputed"))
    assert pd.read_parquet(folder / "rollouts.parquet")["v"].tolist() == ["committed"]
