"""Run ids wherever they enter: every CLI command that takes one, the deployments' flows, on a file:// and an
s3:// store. A bad id is refused with the rule before anything is read or written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from rl_core.run.runs import RunIdError
from rl_core.schema.config import load_config
from tests.conftest import cli_env, run_cli

# Each command that takes a run id, with the bad ids it is tried with (rotated so that every id is tried).
COMMANDS = {
    "run": lambda rid: ["run", "configs/smoke.yaml", "--run-id", rid],
    "resume": lambda rid: ["resume", rid],
    "replay": lambda rid: ["replay", rid, "--iteration", "1", "--stage", "train"],
    "show": lambda rid: ["show", rid],
    "rollouts": lambda rid: ["rollouts", rid, "--iteration", "1"],
    "lineage": lambda rid: ["lineage", rid, "--iteration", "1"],
}
CLI_BAD = ["../escape-x", "a/b", " spaced", "x;rm -rf y", "_base", "_replay", "_prefect", "_mlflow"]


@pytest.mark.slow  # rlfoundry processes; an S3 server
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_refuses_bad_run_ids_before_touching_the_store(command, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "store").mkdir()
    (state / "store" / "_base").mkdir()  # a reserved folder that must stay untouched
    ids = CLI_BAD if command == "run" else CLI_BAD[sorted(COMMANDS).index(command) % 4 :: 4]
    runner = CliRunner()
    for i, rid in enumerate(ids):
        if i == 0:  # the command as a program, once per command (exit code and stderr as a shell sees them)
            r = run_cli(COMMANDS[command](rid), state, timeout=120)
            code, out, err = r.returncode, r.stdout, r.stderr
        else:  # the rest through typer in this process: the same code, without a process start each
            res = runner.invoke(app, COMMANDS[command](rid), env=cli_env(state))
            code, out, err = res.exit_code, res.stdout, res.stderr
        assert code == 2, (command, rid, out, err)
        assert f"invalid run id {rid!r}" in err, (command, rid, err)
        assert "run id:" not in out  # nothing started
    written = sorted(p.relative_to(state / "store").as_posix() for p in (state / "store").rglob("*"))
    assert written == ["_base"], written
    assert not (tmp_path / "escape-x").exists() and not (state / "escape-x").exists()


def _objects(fs, bucket="rlf-test") -> list[str]:
    fs.invalidate_cache()
    return sorted(fs.find(bucket))


@pytest.mark.slow  # rlfoundry processes; an S3 server
def test_bad_run_ids_never_touch_an_s3_store(s3, tmp_path):
    """Through the CLI (run, show, replay) and the deployments' flow functions, against a real S3 server."""
    import s3fs

    from flows.deployments import evaluation_sweep, experiment, replay_stage

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.pipe("rlf-test/ids/_base/keep", b"1")
    before = _objects(fs)
    root = "s3://rlf-test/ids"
    state = tmp_path / "state"
    for args in (
        ["run", "configs/smoke.yaml", "--run-id", "../escape-x", "--set", f"store.uri={root}"],
        ["run", "configs/smoke.yaml", "--run-id", "_base", "--set", f"store.uri={root}"],
        ["show", "../../other-prefix", "--store", root],
        ["replay", "a/b", "--iteration", "1", "--stage", "train", "--store", root],
    ):
        r = run_cli(args, state, timeout=120, env=s3)
        assert r.returncode == 2 and "invalid run id" in r.stderr, (args, r.stderr[-2000:])
    cfg = load_config("configs/smoke.yaml", [f"store.uri={root}"])
    with pytest.raises(RunIdError):
        experiment.fn(cfg, run_id="../escape-x")
    with pytest.raises(RunIdError):
        replay_stage.fn(run_id="_replay", iteration=1, stage="train", store=root)
    with pytest.raises(RunIdError):
        evaluation_sweep.fn(run_ids=["ok", "x;rm -rf y"], store=root)
    assert _objects(fs) == before
    assert not (state / "store").exists()
