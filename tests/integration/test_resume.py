"""Crash anywhere, resume, and end with the same weights: SIGKILL at points spread over all six stages."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.conftest import cli, cli_env, committed_stages, replayed_identical, show_json

ROOT = Path(__file__).resolve().parents[2]
# No lineage is read here: MLflow off (a fresh MLflow database costs each process its schema migrations).
SMOKE = ["configs/smoke.yaml", *("--set", "rollout.engine=hf", "--set", "tracking.enabled=false")]
# Four iterations: the chain's kill points lie in the first two, the cadence test below needs four, and an
# iteration of the smoke config computes for a second or two — a process start costs ten times that.
FOUR = ["--set", "experiment.iterations=4"]

# The crash matrix, chained (one run; each resume killed at the next point; the last resume finishes), in the
# order the points come in a run: inside a stage, half-way through its outputs, right after a commit, between
# stages. The fast-starting HF engine: resume does not depend on the engine. The points that involve vLLM (a
# half-written artifact, the weight sync, a committed generate) are the vLLM half of the matrix, chained the
# same way on the smoke run of tests/integration/test_run_end_to_end.py.
KILL_POINTS = [
    ("generate:start", 1),
    ("execute_envs:outputs", 1),
    ("score_rewards:committed", 1),
    ("train:outputs", 1),
    ("evaluate:start", 1),
    ("audit:outputs", 2),
    ("train:start", 2),
    ("evaluate:outputs", 2),
]


def _cli(args, state, fault=None, timeout=600):
    env = cli_env(state)
    env.pop("RLFOUNDRY_FAULT", None)
    if fault:
        env["RLFOUNDRY_FAULT"] = fault
    return cli(args, env, timeout)


# Asynchronous RL (rollout.max_staleness 1, three iterations): iteration k+1's rollout stages run beside train
# k on another thread. Killed while the next iteration generates, right after it committed, and while the
# trainer writes: the resumed run still ends with the uninterrupted asynchronous run's weights. (Not chained:
# which of train k and generate k+1 commits first is not fixed, so a later point may already be past.)
ASYNC = ["--set", "rollout.max_staleness=1", "--set", "experiment.iterations=3"]
ASYNC_KILL_POINTS = [("generate:committed", 2), ("train:outputs", 1), ("score_rewards:start", 3)]


_REFERENCES: dict[str, tuple[list[str], dict]] = {}


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """One state folder for the module's runs (each its own run id): they share one warmed-up base model,
    built by the first run, where each would otherwise pay ~20 s for its own."""
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def reference(state):
    """The uninterrupted run's per-iteration weights and metrics, per set of overrides (run on first use)."""

    def get(extra: tuple[str, ...]) -> tuple[list[str], dict]:
        key = " ".join(extra)
        if key not in _REFERENCES:
            run_id = f"ref{len(_REFERENCES)}"
            r = _cli(["run", *SMOKE, "--run-id", run_id, *extra], state)
            assert r.returncode == 0, r.stderr[-3000:]
            data = show_json(state, run_id)
            _REFERENCES[key] = [it["policy_sha256"] for it in data["iterations"]], data
        return _REFERENCES[key]

    return get


@pytest.fixture(scope="module")
def chain(state):
    """The chained crash matrix: per kill point the killing process's return code and what was committed
    when it died; the refusals tried on the first crash; the run's state once the last resume finished."""
    steps: dict[str, tuple[int, set, str]] = {}
    refusals: dict[str, tuple[int, str]] = {}
    args = ["run", *SMOKE, *FOUR, "--run-id", "r"]
    for point, k in KILL_POINTS:
        r = _cli(args, state, fault=f"{point}@{k}")
        steps[f"{point}@{k}"] = (r.returncode, committed_stages(show_json(state, "r")), r.stderr[-2000:])
        if args[0] == "run":  # a config change is refused (the difference printed); an unknown run too
            runner = CliRunner()
            bad = runner.invoke(app, ["resume", "r", "--set", "train.lr=0.5"], env=cli_env(state))
            refusals["changed"] = (bad.exit_code, bad.stderr)
            nosuch = runner.invoke(app, ["resume", "nosuch"], env=cli_env(state))
            refusals["nosuch"] = (nosuch.exit_code, nosuch.stderr)
        args = ["resume", "r"]
    final = _cli(args, state)
    assert final.returncode == 0, final.stderr[-3000:]
    return steps, refusals, show_json(state, "r")


@pytest.mark.slow
@pytest.mark.parametrize("point,iteration", KILL_POINTS, ids=[f"{p}@{i}" for p, i in KILL_POINTS])
def test_killed_run_resumes_to_identical_weights(reference, chain, point, iteration):
    hashes, ref_data = reference(tuple(FOUR))
    steps, _, after = chain
    names = list(steps)
    i = names.index(f"{point}@{iteration}")
    returncode, done, stderr = steps[names[i]]
    assert returncode == -signal.SIGKILL, (returncode, stderr)
    assert len(done) < 4 * len(after["stages"]), "the kill left the run unfinished"
    if i:  # the resume killed here kept everything the process before it had committed
        assert done >= steps[names[i - 1]][1], (names[i - 1], names[i])
    assert [it["policy_sha256"] for it in after["iterations"]] == hashes
    ref_eval = [it["stages"]["evaluate"]["metrics"]["accuracy"] for it in ref_data["iterations"]]
    assert [it["stages"]["evaluate"]["metrics"]["accuracy"] for it in after["iterations"]] == ref_eval


@pytest.mark.slow
def test_resume_with_changed_config_is_refused_unless_forced(chain):
    _, refusals, _ = chain
    code, err = refusals["changed"]
    assert code == 2 and "train.lr: 0.0001 -> 0.5" in err, (code, err)
    assert refusals["nosuch"][0] == 2


def _bytes_of(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_extending_and_forced_changes_keep_every_committed_byte(reference, state):
    """Issue 21 item 1, with real stages: a 2-iteration run extended to 4 needs no --force, rewrites nothing
    and ends with the uninterrupted 4-iteration run's weights (the optimizer state reloaded from the store);
    a forced change of what stages compute is a new config version from iteration 5, every earlier byte kept;
    each iteration replays under the config it ran with."""
    hashes, _ = reference(tuple(FOUR))
    run_dir = state / "store" / "ext"
    r = _cli(["run", *SMOKE, "--run-id", "ext", "--set", "experiment.iterations=2"], state)
    assert r.returncode == 0, r.stderr[-3000:]
    two = _bytes_of(run_dir)
    r = _cli(["resume", "ext", "--set", "experiment.iterations=4"], state)
    assert r.returncode == 0, r.stderr[-3000:]
    four = _bytes_of(run_dir)
    kept = {k: v for k, v in four.items() if k in two and k != "run.json"}
    assert kept == {k: v for k, v in two.items() if k != "run.json"}, "the extension rewrote committed work"
    shown = show_json(state, "ext")
    assert [it["policy_sha256"] for it in shown["iterations"]] == hashes
    runner = CliRunner()
    bad = runner.invoke(app, ["resume", "ext", "--set", "train.lr=0.0002"], env=cli_env(state))
    assert bad.exit_code == 2 and "train.lr: 0.0001 -> 0.0002" in bad.stderr and "--force" in bad.stderr
    sets = ["--set", "train.lr=0.0002", "--set", "experiment.iterations=5"]
    r = _cli(["resume", "ext", *sets, "--force"], state)
    assert r.returncode == 0, r.stderr[-3000:]
    five = _bytes_of(run_dir)
    assert {k: v for k, v in five.items() if k in four and k != "run.json"} == {
        k: v for k, v in four.items() if k != "run.json"
    }, "the forced change rewrote committed work"
    assert any(k.startswith("iter-0005/train/") for k in five)
    shown = show_json(state, "ext")
    versions = shown["config_versions"]
    assert [v["from_iteration"] for v in versions] == [1, 5]
    by_iter = {it["iteration"]: it["stages"]["train"]["config_hash"] for it in shown["iterations"]}
    assert {by_iter[k] for k in (1, 2, 3, 4)} == {versions[0]["config_hash"]}
    assert by_iter[5] == versions[1]["config_hash"]
    for k in (2, 5):  # each under the config it ran with: both reproduce their stored outputs
        replayed_identical(state, "ext", k, ["train"])


@pytest.mark.slow
@pytest.mark.parametrize("point,iteration", ASYNC_KILL_POINTS, ids=[f"{p}@{i}" for p, i in ASYNC_KILL_POINTS])
def test_killed_async_run_resumes_to_identical_weights(reference, state, point, iteration):
    hashes, ref_data = reference(tuple(ASYNC))
    assert len(hashes) == 3
    # the schedule: iteration k sampled from the policy of k-2 (the warm-up checkpoint for k <= 2)
    versions = [it["stages"]["generate"]["metrics"]["policy_version"] for it in ref_data["iterations"]]
    assert versions == [0, 0, 1]
    run_id = f"a-{point.replace(':', '-')}-{iteration}"
    killed = _cli(["run", *SMOKE, "--run-id", run_id, *ASYNC], state, fault=f"{point}@{iteration}")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    resumed = _cli(["resume", run_id], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = show_json(state, run_id)
    assert [it["policy_sha256"] for it in after["iterations"]] == hashes
    if point == "generate:committed":  # a stale generate stage replays identically
        replayed_identical(state, run_id, 3, ["generate"])


# Checkpoints on a cadence: with train.checkpoint_every 3 of 4 iterations, iterations 1 and 2 commit manifests
# whose checkpoint and optimizer state are not stored. Killed before train 3 (which needs both), with this
# machine's local copies of them removed, the resumed run rebuilds them by re-running the train stages of 1
# and 2 and ends with the weights of a run that stores every one.
CADENCE = ["--set", "experiment.iterations=4", "--set", "train.checkpoint_every=3"]


def _drop_local_copies(run_dir: Path) -> list[str]:
    """Remove this machine's local folders of the run's unstored checkpoints; their digests."""
    from rl_core.artifacts.paths import cache_dir

    dropped = []
    for path in sorted(run_dir.glob("iter-*/train/_manifest.json")):
        ckpt = json.loads(path.read_text())["outputs"]["checkpoint"]
        if ckpt.get("stored") is False:
            shutil.rmtree(cache_dir("checkpoints") / ckpt["sha256"], ignore_errors=True)
            dropped.append(ckpt["sha256"])
    return dropped


@pytest.mark.slow
def test_checkpoint_cadence_resumes_and_replays_by_rebuilding(reference, state):
    hashes, _ = reference(tuple(FOUR))
    args = ["run", *SMOKE, "--run-id", "c", *CADENCE]
    killed = _cli(args, state, fault="train:start@3")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    run_dir = state / "store" / "c"
    assert _drop_local_copies(run_dir), "no unstored checkpoint was committed before the kill"
    resumed = _cli(["resume", "c"], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [it["policy_sha256"] for it in show_json(state, "c")["iterations"]] == hashes
    # Only the cadence point and the last iteration wrote weights and optimizer state to the store.
    for output in ("checkpoint", "optimizer.safetensors"):
        written = sorted(p.parts[-3] for p in run_dir.glob(f"iter-*/train/{output}"))
        assert written == ["iter-0003", "iter-0004"], (output, written)
    chain = json.loads(_cli(["lineage", "c", "--iteration", "4", "--json"], state, timeout=120).stdout)
    assert [c.get("checkpoint_stored") for c in chain] == [True, True, False, False, None]  # 4, 3, 2, 1, base
    for stage in ("train", "generate"):  # a replay on a machine without the local copies rebuilds them
        assert len(_drop_local_copies(run_dir)) == 2
        (report,) = replayed_identical(state, "c", 2, [stage]).values()
        assert not report["metrics_differing"], report


@pytest.mark.slow
def test_a_run_writing_behind_killed_before_its_train_commit_resumes_to_identical_weights(reference, state):
    """``store.write_behind`` on the local store: the process is killed on the write-behind thread once the
    checkpoint and optimizer state of iteration 2 are written, before the train stage's manifest. The stage
    is not committed; the resume clears what it wrote, runs it again and ends with the uninterrupted run's
    weights (which wrote in the stage: where the checkpoint is written changes no byte of it)."""
    hashes, _ = reference(tuple(FOUR))
    args = ["run", *SMOKE, *FOUR, "--set", "store.write_behind=true", "--run-id", "wb"]
    killed = _cli(args, state, fault="train:outputs@2")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    done = committed_stages(show_json(state, "wb"))
    assert (1, "train") in done and (2, "train") not in done, done
    train = state / "store" / "wb" / "iter-0002" / "train"
    assert (train / "optimizer.safetensors").is_file() and (train / "checkpoint").is_dir()
    resumed = _cli(["resume", "wb"], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [it["policy_sha256"] for it in show_json(state, "wb")["iterations"]] == hashes
