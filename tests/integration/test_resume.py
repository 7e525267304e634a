"""Crash anywhere, resume, and end with the same weights: SIGKILL at points spread over all six stages."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "flows.cli"]
SMOKE = ["configs/smoke.yaml"]

# (fault point, iteration, engine): inside a stage, half-way through writing an artifact, between stages,
# during a weight sync. vLLM where the point involves it (weight sync, a committed generate); the
# fast-starting HF engine elsewhere: resume does not depend on the engine, and the suite stays short.
KILL_POINTS = [
    ("generate:start", 1, "hf"),
    ("write", 1, "vllm"),
    ("execute_envs:outputs", 1, "hf"),
    ("score_rewards:committed", 1, "hf"),
    ("train:outputs", 1, "hf"),
    ("evaluate:start", 1, "hf"),
    ("sync", 2, "vllm"),
    ("generate:committed", 2, "vllm"),
    ("train:start", 2, "hf"),
    ("audit:outputs", 2, "hf"),
    ("evaluate:outputs", 2, "hf"),
]


def _cli(args, state, fault=None, timeout=600):
    env = cli_env(state)
    env.pop("RLFOUNDRY_FAULT", None)
    if fault:
        env["RLFOUNDRY_FAULT"] = fault
    return subprocess.run(CLI + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# Asynchronous RL (rollout.max_staleness 1, three iterations): iteration k+1's rollout stages run beside train
# k on another thread. Killed while the next iteration generates, right after it committed, and while the
# trainer writes: the resumed run still ends with the uninterrupted asynchronous run's weights.
ASYNC = ["--set", "rollout.max_staleness=1", "--set", "experiment.iterations=3"]
ASYNC_KILL_POINTS = [("generate:committed", 2), ("train:outputs", 1), ("score_rewards:start", 3)]


def _final(state, run_id) -> dict:
    r = _cli(["show", run_id, "--json"], state, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


_REFERENCES: dict[str, tuple[list[str], dict]] = {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's per-iteration weights and metrics, per rollout engine (run on first use)."""

    def get(engine: str, extra: tuple[str, ...] = ()) -> tuple[list[str], dict]:
        key = " ".join((engine, *extra))
        if key not in _REFERENCES:
            state = tmp_path_factory.mktemp(f"ref-{engine}")
            r = _cli(["run", *SMOKE, "--run-id", "ref", "--set", f"rollout.engine={engine}", *extra], state)
            assert r.returncode == 0, r.stderr[-3000:]
            data = _final(state, "ref")
            _REFERENCES[key] = [it["policy_sha256"] for it in data["iterations"]], data
        return _REFERENCES[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    "point,iteration,engine", KILL_POINTS, ids=[f"{p}@{i}-{e}" for p, i, e in KILL_POINTS]
)
def test_killed_run_resumes_to_identical_weights(reference, tmp_path, point, iteration, engine):
    hashes, ref_data = reference(engine)
    killed = _cli(
        ["run", *SMOKE, "--run-id", "r", "--set", f"rollout.engine={engine}"],
        tmp_path,
        fault=f"{point}@{iteration}",
    )
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    before = _final(tmp_path, "r")
    done = [
        (it["iteration"], st)
        for it in before["iterations"]
        for st, v in it["stages"].items()
        if v["status"] == "committed"
    ]
    assert len(done) < 2 * len(before["stages"]), "the kill left the run unfinished"
    resumed = _cli(["resume", "r"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _final(tmp_path, "r")
    assert [it["policy_sha256"] for it in after["iterations"]] == hashes
    ref_eval = [it["stages"]["evaluate"]["metrics"]["accuracy"] for it in ref_data["iterations"]]
    assert [it["stages"]["evaluate"]["metrics"]["accuracy"] for it in after["iterations"]] == ref_eval


@pytest.mark.slow
def test_resume_with_changed_config_is_refused_unless_forced(tmp_path):
    killed = _cli(
        ["run", *SMOKE, "--run-id", "c", "--set", "rollout.engine=hf"], tmp_path, fault="train:start@1"
    )
    assert killed.returncode == -signal.SIGKILL
    r = _cli(["resume", "c", "--set", "train.lr=0.5"], tmp_path, timeout=120)
    assert r.returncode == 2 and "train.lr: 0.0001 -> 0.5" in r.stderr
    assert _cli(["resume", "nosuch"], tmp_path, timeout=120).returncode == 2


@pytest.mark.slow
@pytest.mark.parametrize("point,iteration", ASYNC_KILL_POINTS, ids=[f"{p}@{i}" for p, i in ASYNC_KILL_POINTS])
def test_killed_async_run_resumes_to_identical_weights(reference, tmp_path, point, iteration):
    hashes, ref_data = reference("hf", tuple(ASYNC))
    assert len(hashes) == 3
    # the schedule: iteration k sampled from the policy of k-2 (the warm-up checkpoint for k <= 2)
    versions = [it["stages"]["generate"]["metrics"]["policy_version"] for it in ref_data["iterations"]]
    assert versions == [0, 0, 1]
    args = ["run", *SMOKE, "--run-id", "a", "--set", "rollout.engine=hf", *ASYNC]
    killed = _cli(args, tmp_path, fault=f"{point}@{iteration}")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    resumed = _cli(["resume", "a"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _final(tmp_path, "a")
    assert [it["policy_sha256"] for it in after["iterations"]] == hashes
    if point == "generate:committed":  # a stale generate stage replays identically
        r = _cli(["replay", "a", "--iteration", "3", "--stage", "generate", "--json"], tmp_path, timeout=300)
        assert r.returncode == 0 and json.loads(r.stdout)["identical"] is True, r.stdout + r.stderr[-2000:]


# Checkpoints on a cadence: with train.checkpoint_every 3 of 4 iterations, iterations 1 and 2 commit manifests
# whose checkpoint and optimizer state are not stored. Killed before train 3 (which needs both), with this
# machine's local copies of them removed, the resumed run rebuilds them by re-running the train stages of 1
# and 2 and ends with the weights of a run that stores every one.
CADENCE = ["--set", "experiment.iterations=4", "--set", "train.checkpoint_every=3"]


def _drop_local_copies(run_dir: Path) -> list[str]:
    """Remove this machine's local folders of the run's unstored checkpoints; their digests."""
    from rl_core.paths import cache_dir

    dropped = []
    for path in sorted(run_dir.glob("iter-*/train/_manifest.json")):
        ckpt = json.loads(path.read_text())["outputs"]["checkpoint"]
        if ckpt.get("stored") is False:
            shutil.rmtree(cache_dir("checkpoints") / ckpt["sha256"], ignore_errors=True)
            dropped.append(ckpt["sha256"])
    return dropped


@pytest.mark.slow
def test_checkpoint_cadence_resumes_and_replays_by_rebuilding(reference, tmp_path):
    hashes, _ = reference("hf", ("--set", "experiment.iterations=4"))
    args = ["run", *SMOKE, "--run-id", "c", "--set", "rollout.engine=hf", *CADENCE]
    killed = _cli(args, tmp_path, fault="train:start@3")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    run_dir = tmp_path / "store" / "c"
    assert _drop_local_copies(run_dir), "no unstored checkpoint was committed before the kill"
    resumed = _cli(["resume", "c"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [it["policy_sha256"] for it in _final(tmp_path, "c")["iterations"]] == hashes
    # Only the cadence point and the last iteration wrote weights and optimizer state to the store.
    for output in ("checkpoint", "optimizer.pt"):
        written = sorted(p.parts[-3] for p in run_dir.glob(f"iter-*/train/{output}"))
        assert written == ["iter-0003", "iter-0004"], (output, written)
    chain = json.loads(_cli(["lineage", "c", "--iteration", "4", "--json"], tmp_path, timeout=120).stdout)
    assert [c.get("checkpoint_stored") for c in chain] == [True, True, False, False, None]  # 4, 3, 2, 1, base
    for stage in ("train", "generate"):  # a replay on a machine without the local copies rebuilds them
        assert len(_drop_local_copies(run_dir)) == 2
        r = _cli(["replay", "c", "--iteration", "2", "--stage", stage, "--json"], tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        report = json.loads(r.stdout)
        assert report["identical"] is True and not report["metrics_differing"], report
