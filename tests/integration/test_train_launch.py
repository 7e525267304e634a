"""The train stage as N processes (train.world_size, train.tp_size): ZeRO-2 and AutoTP on 2 CPU ranks, ZeRO-3
on 3 with a sequence a forward (idle forwards: each mini-batch splits 3/3/2), gloo, against the single
process; a rank killed with SIGKILL, resume, and the run going on at another world size.

One smoke run in the flow's process (ZeRO-0, 4 optimizer steps per iteration) is the reference; its first
train stage is re-run from the same stored inputs as a torchrun job with each layout, and each job's
per-step losses must match the single process's within LOSS_TOL (the ranks sum gradients in another order:
float32 rounding, nothing more). The layouts' jobs run at once (each under the others' load), and no job may
have needed the retry an abort gets; ZeRO-2's job run again (the retry after a rank's abort) must match its
first bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli, cli_env

ROOT = Path(__file__).resolve().parents[2]
# 32 completions per iteration in mini-batches of 8: 4 optimizer steps per train stage; the HF engine starts
# in a second (the rollout engine is not what is under test).
SMOKE = [
    "configs/smoke.yaml",
    *("--set", "train.micro_batch_size=8", "--set", "rollout.engine=hf"),
    *("--set", "tracking.enabled=false"),  # no lineage read here: no MLflow database to create
]
# ZeRO-3: the layout whose stored optimizer state DeepSpeed creates last (its reload crashed at iteration 2)
TWO = ["--set", "train.world_size=2", "--set", "train.zero_stage=3"]
LOSS_TOL = 1e-4
# No zero1 layout here: it runs DeepSpeed's stage-1/2 optimizer as zero2 does (a flag apart), through the
# same launch, and test_zero_resume matches it on 2 ranks against 1 (the suite budget: ~25 s).
# (zero stage, tp size, world size, extra train settings). ZeRO-3 on 3 ranks, a sequence a forward: each
# mini-batch of 8 splits 3/3/2, so rank 2 runs one idle forward and backward a step (ZeRO-3 gathers the
# weights in every forward: a rank that skipped it would leave its peers blocked).
LAYOUTS = {
    "zero2": (2, 1, 2, {}),
    "zero3": (3, 1, 3, {"forward_sequences": 1}),
    "tp2": (0, 2, 2, {}),
}
# The three layouts' jobs launched at once, each under the others' load (7 ranks and 3 agents). ZeRO-2's
# repeat, which must match its first job bit for bit, is the job run again after a rank's abort
# (test_a_rank_aborted_by_a_native_library_is_run_once_more): one 2-rank job fewer in the suite's budget.


def _cli(args: list[str], state: Path, fault: str | None = None, timeout: float = 600):
    env = cli_env(state)
    env.pop("RLFOUNDRY_FAULT", None)
    if fault:
        env["RLFOUNDRY_FAULT"] = fault
    return cli(args, env, timeout)


def _manifest(state: Path, run_id: str, k: int) -> dict | None:
    p = state / "store" / run_id / f"iter-{k:04d}" / "train" / "_manifest.json"
    return json.loads(p.read_text()) if p.exists() else None


def _job_processes(state: Path) -> list[str]:
    """The train jobs' processes (agent and ranks) of runs stored under ``state``: each names its store on
    its command line, so another test's job on the machine is not counted."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [
        line for line in out.splitlines() if "rl_core.training.train_launch" in line and str(state) in line
    ]


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state folder with the single-process reference run ``one`` (its base model shared by the others)."""
    state = tmp_path_factory.mktemp("launch")
    # one iteration: only its train stage is re-run here
    r = _cli(["run", *SMOKE, "--set", "experiment.iterations=1", "--run-id", "one"], state)
    assert r.returncode == 0, r.stderr[-3000:]
    return state


def _launch(state: Path, layout: str) -> Any:
    """The reference run's first train stage as a job of ``layout``, into the store's scratch area (the store
    refuses any URI outside its root), as a replay writes: its StageResult, context, and where the log of a
    first attempt that aborted would be kept."""
    from rl_core.artifacts.manifest import ArtifactRef
    from rl_core.artifacts.paths import state_dir
    from rl_core.artifacts.stage import StageJob
    from rl_core.artifacts.store import Store
    from rl_core.run.context import RunContext
    from rl_core.run.runs import run_config
    from rl_core.schema.config import config_from_dict
    from rl_core.training.train_launch import _log_name, launch_train

    zero, tp, world, extra = LAYOUTS[layout]
    store = Store(f"file://{state}/store")
    data = run_config(store, "one").model_dump(mode="json")
    data["train"] |= {"world_size": world, "zero_stage": zero, "tp_size": tp, **extra}
    ctx = RunContext(config_from_dict(data), "one", store)
    inputs = {k: ArtifactRef.model_validate(v) for k, v in _manifest(state, "one", 1)["inputs"].items()}
    out = f"{store.root}/_replay/one/{layout}/iter-0001/train"
    job = StageJob(1, inputs, out)
    aborted = (state_dir() / "logs" / _log_name(ctx, job)).with_suffix(".aborted.log")
    return launch_train(ctx, job), ctx, aborted


@pytest.fixture(scope="module")
def launched(state: Path) -> dict[str, Any]:
    """The layouts' jobs launched at once: every job runs under the load of the others, as the suite's two
    workers loaded the job whose rank once aborted after its work. No job may have needed its retry
    (``_aborted``): the retry exists for an abort during the work, and must not hide one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLFOUNDRY_STATE_DIR", str(state))
        with ThreadPoolExecutor(len(LAYOUTS)) as pool:
            jobs = {name: pool.submit(_launch, state, name) for name in LAYOUTS}
            return {name: job.result() for name, job in jobs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_launched_layouts_match_one_process(state: Path, launched: dict[str, Any], layout: str):
    from rl_core.artifacts.manifest import ArtifactRef
    from rl_core.models.model import load_model

    zero, tp, world, extra = LAYOUTS[layout]
    got, ctx, aborted = launched[layout]
    assert not aborted.exists(), f"a rank of the {layout} job aborted: {aborted}"
    one = _manifest(state, "one", 1)
    want = one["metrics"]["step_losses"]
    assert len(want) == 4 and len(got.metrics["step_losses"]) == 4
    gaps = [abs(a - b) for a, b in zip(got.metrics["step_losses"], want, strict=True)]
    assert max(gaps) < LOSS_TOL, (layout, got.metrics["step_losses"], want)
    assert len({round(x, 5) for x in want}) > 1  # the steps really moved the policy
    # The whole weights come back as the usual folder: every tensor, whole-shaped, close to the one process's.
    new = load_model(ctx.local_checkpoint(got.outputs["checkpoint"])).state_dict()
    ref = load_model(ctx.local_checkpoint(ArtifactRef.model_validate(one["outputs"]["checkpoint"])))
    ref_sd = ref.state_dict()
    assert set(new) == set(ref_sd)
    assert max(float((new[k] - ref_sd[k]).abs().max()) for k in new) < 1e-3
    # What each rank holds: ZeRO-1/2 its share of the optimizer state, ZeRO-3 of the weights too, AutoTP the
    # shards.
    m = got.metrics
    whole = m["model_params_mb"]
    for r in range(world):
        assert m[f"rank{r}_optimizer_mb"] < (2 / world + 0.5) * whole, m  # Adam keeps 2x the weights
        if zero == 3:
            assert m[f"rank{r}_params_mb"] < (1 / world + 0.1) * whole, m
        if tp == 2:
            assert m[f"rank{r}_params_mb"] < 0.9 * whole, m
    # ZeRO-3 on 3 ranks: one idle forward (rank 2's) in each of the 4 optimizer steps, counted over the ranks
    assert m["idle_forwards"] == (4 if layout == "zero3" else 0), m


@pytest.mark.slow
def test_a_killed_rank_fails_cleanly_the_run_resumes_to_the_same_weights_and_goes_on_on_one(state: Path):
    """Rank 0 SIGKILLed in iteration 2's train stage (rank 1 blocked in a collective): the run fails naming
    it, commits nothing of the stage and leaves no rank behind; ``resume`` on 2 ranks ends with the stage a
    fresh launched job on the same stored inputs reproduces bit for bit (a replay), so no leftover of the
    killed job (a partial output, a rank still running) reached it; then the run goes on on one process from
    the 2-rank ZeRO-3 state (its shards gathered when stored). The resumed stage is checked against a replay,
    not a second uninterrupted run: that resume equals an uninterrupted run stage for stage is
    tests/integration/test_resume.py's (the suite budget: a 2-rank run, ~50 s)."""
    killed = _cli(["run", *SMOKE, *TWO, "--run-id", "killed"], state, fault="train:rank0@2", timeout=300)
    assert killed.returncode != 0
    assert "rank 0 of 2 was killed by SIGKILL" in killed.stderr + killed.stdout
    first = _manifest(state, "killed", 1)
    assert first is not None and _manifest(state, "killed", 2) is None
    assert _job_processes(state) == []  # the peer blocked in a collective was ended, no rank left behind

    resumed = _cli(["resume", "killed"], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _manifest(state, "killed", 1) == first  # iteration 1 kept, not re-run
    second = _manifest(state, "killed", 2)
    assert all(_manifest(state, "killed", k)["metrics"]["world_size"] == 2 for k in (1, 2))
    # A fresh launched job on the resumed stage's stored inputs reproduces it bit for bit.
    replay = _cli(["replay", "killed", "--iteration", "2", "--stage", "train", "--json"], state)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert json.loads(replay.stdout)["identical"] is True

    # Another world size is where the run goes on, not another config: no --force needed.
    on_one = ["--set", "experiment.iterations=3", "--set", "train.world_size=1"]
    more = _cli(["resume", "killed", *on_one], state)
    assert more.returncode == 0, more.stderr[-3000:]
    assert [_manifest(state, "killed", k) for k in (1, 2)] == [first, second]  # kept, not re-run
    third = _manifest(state, "killed", 3)
    assert third["metrics"]["world_size"] == 1
    # The one process (ZeRO-3 in the flow) went on from the 2-rank state (ZeRO-3 shards gathered when stored).
    assert third["inputs"]["optimizer"]["uri"].endswith("iter-0002/train/optimizer.safetensors")
    assert os.path.getsize(Path(third["inputs"]["optimizer"]["uri"].removeprefix("file://"))) > 0


@pytest.mark.slow
def test_a_rank_aborted_by_a_native_library_is_run_once_more(
    state: Path, launched: dict[str, Any], monkeypatch: pytest.MonkeyPatch
):
    """A rank ended by SIGABRT (a native library's abort: "terminate called without an active exception" once
    failed a suite run) gets the job run once more; its first log is kept with the rank's Python stacks
    (PYTHONFAULTHANDLER), and the outputs are the stage's own: the same step losses as the one process, and
    the very bits of the ZeRO-2 job launched on the same inputs without a fault (a repeat, bit for bit)."""
    from rl_core.artifacts.manifest import ArtifactRef
    from rl_core.artifacts.stage import StageJob
    from rl_core.artifacts.store import Store
    from rl_core.run.context import RunContext
    from rl_core.run.runs import run_config
    from rl_core.schema.config import config_from_dict
    from rl_core.training.train_launch import launch_train

    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(state))
    monkeypatch.setenv("RLFOUNDRY_FAULT", "train:rank1@1:abort")
    monkeypatch.setenv("RLFOUNDRY_FAULT_ONCE", str(state / "aborted-once"))
    store = Store(f"file://{state}/store")
    data = run_config(store, "one").model_dump(mode="json")
    zero, tp, world, extra = LAYOUTS["zero2"]  # as the clean job it is compared with
    data["train"] |= {"world_size": world, "zero_stage": zero, "tp_size": tp, **extra}
    ctx = RunContext(config_from_dict(data), "one", store)
    one = _manifest(state, "one", 1)
    inputs = {k: ArtifactRef.model_validate(v) for k, v in one["inputs"].items()}
    got = launch_train(ctx, StageJob(1, inputs, f"{store.root}/_replay/one/abort/iter-0001/train"))
    gaps = [
        abs(a - b) for a, b in zip(got.metrics["step_losses"], one["metrics"]["step_losses"], strict=True)
    ]
    assert max(gaps) < LOSS_TOL
    clean = launched["zero2"][0]  # the same layout, launched on the same stored inputs
    assert got.metrics["step_losses"] == clean.metrics["step_losses"]
    assert got.outputs["checkpoint"].sha256 == clean.outputs["checkpoint"].sha256
    (first,) = (state / "logs").glob("train-one-iter-0001-*.aborted.log")
    text = first.read_text(errors="replace")
    assert "Fatal Python error: Aborted" in text and "exitcode  : -6" in text  # the stacks, then the cause
