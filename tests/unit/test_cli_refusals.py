"""Bad command-line input is refused in one line naming what is wrong, before anything is trained or written,
and nothing already stored is overwritten: an --out that holds something, a report written over a run, a
--store with credentials or an unknown protocol, negative counts and limits, a binary samples file, a path
that is not a folder. No server, no training: the commands stop before either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _refused(args: list[str], *names: str) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(n in lines[0] for n in names), lines
    return lines[0]


# 1: judge train / reward-model train never train over what --out holds


@pytest.mark.parametrize(
    "command", [["judge", "train", "--config", "configs/smoke.yaml"], ["reward-model", "train"]]
)
def test_train_refuses_an_out_that_holds_something_before_training(command, tmp_path, state_dir, monkeypatch):
    import rl_core.scoring.judge_train as judge_train
    import rl_core.scoring.reward_model as reward_model

    monkeypatch.setattr(judge_train, "train_judge", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(reward_model, "train_reward_model", lambda *a, **k: pytest.fail("trained"))
    ckpt = tmp_path / "store" / "r1" / "iter-0001" / "train" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"committed weights")
    _refused([*command, "--out", str(ckpt)], f"--out {ckpt}", "not empty")
    assert (ckpt / "model.safetensors").read_bytes() == b"committed weights"
    file = tmp_path / "a-file"
    file.write_text("keep")
    _refused([*command, "--out", str(file)], f"--out {file}", "a file")
    assert file.read_text() == "keep"


# 2: report --out never replaces a run's file, nor a file it did not write


def test_report_refuses_an_out_in_the_store_a_folder_or_a_foreign_file(tmp_path, state_dir):
    store = tmp_path / "store"
    (store / "r1").mkdir(parents=True)
    record = store / "r1" / "run.json"
    record.write_text('{"run_id": "r1"}')
    base = ["report", "r1", "--store", str(store), "--out"]
    _refused([*base, str(record)], f"--out {record}", "inside the store")
    assert record.read_text() == '{"run_id": "r1"}'
    _refused([*base, str(tmp_path)], f"--out {tmp_path}", "folder")
    notes = tmp_path / "notes.html"
    notes.write_text("<html>my notes</html>")
    _refused([*base, str(notes)], f"--out {notes}", "not a report")
    assert notes.read_text() == "<html>my notes</html>"


def test_report_replaces_only_a_report_it_wrote(tmp_path, monkeypatch):
    import rl_core.pipeline.report as report
    from flows.cli.debugging import _report_path
    from rl_core.artifacts.store import Store

    data = {"iterations": [], "base": {"evaluate": {}}, "iterations_committed": 0, "iterations_planned": 1,
            "store": "s", "config_hash": "h" * 64}  # fmt: skip
    monkeypatch.setattr(report, "collect", lambda store, run_id: data)
    monkeypatch.setattr("rl_core.run.runs.load_run", lambda store, run_id: {"config": {}})
    monkeypatch.setattr(report, "figures", lambda data, alarms: [])
    page = report.build(None, "r1")
    assert page.startswith(report.REPORT_MARK)
    old = tmp_path / "r1.html"
    old.write_text(page)
    assert _report_path(old, Store(str(tmp_path / "store"))) == old


# 3: no credentials printed; no store read outside its root


@pytest.mark.parametrize("root", ["http://user:pw@127.0.0.1:9/x", "s3://AKIA:secret@bucket/x"])
def test_a_store_option_with_credentials_is_refused_without_them(root, state_dir):
    line = _refused(["show", "a1", "--store", root], "--store", "credentials")
    assert "pw" not in line and "secret" not in line


@pytest.mark.parametrize("root", ["http://user:pw@127.0.0.1:9/x", "foo://bar"])
def test_a_deployments_store_parameter_is_held_as_the_option_is(root, state_dir):
    """The check is in the store's opening (``rl_core.run.context.checked_root``), not in the CLI: a Prefect
    form's ``store`` parameter (the sweep, replay) is refused the same way, without the password."""
    from flows.deployments import _store
    from rl_core.schema.config import ConfigError

    with pytest.raises(ConfigError, match=r"^store ") as e:
        _store(root)
    assert "pw" not in str(e.value)


def test_a_store_option_of_an_unknown_protocol_is_one_line(state_dir):
    _refused(["show", "a1", "--store", "foo://bar"], "--store foo://bar", "'foo'")


def test_deploy_never_prints_the_api_password(monkeypatch, capsys):
    import prefect.client.orchestration as orchestration

    from flows.cli import operations

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def api_healthcheck(self):
            return ConnectionError("refused")

    monkeypatch.setattr(orchestration, "get_client", lambda **k: Client())
    with pytest.raises(typer.Exit):
        operations._check_server("http://admin:pw@127.0.0.1:9/api")
    err = capsys.readouterr().err
    assert "pw" not in err and "http://***@127.0.0.1:9/api" in err
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PREFECT_API_URL", "http://admin:pw@127.0.0.1:9/api")
    assert operations._prepare(ROOT / "configs/smoke.yaml")[1] == "http://***@127.0.0.1:9/api"


def test_a_local_store_reads_and_writes_nothing_through_a_link_out_of_it(tmp_path):
    from rl_core.artifacts.store import ArtifactError, Store

    (tmp_path / "outside.json").write_text('{"secret": 1}')
    real = tmp_path / "real"
    (real / "r1" / "iter-0001" / "train").mkdir(parents=True)
    (tmp_path / "linked").symlink_to(real)  # a store root that is itself a link works
    store = Store(str(tmp_path / "linked"))
    stage = store.stage_uri("r1", 1, "train")
    store.write_bytes(f"{stage}/ok.bin", b"x")
    assert store.read_bytes(f"{stage}/ok.bin") == b"x"
    (real / "r1" / "iter-0001" / "train" / "_manifest.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(ArtifactError, match=r"_manifest.json leads outside the store"):
        store.read_manifest(stage)
    (real / "r1" / "iter-0002").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ArtifactError, match="leads outside the store"):
        store.write_bytes(f"{store.run_uri('r1')}/iter-0002/x.bin", b"y")
    assert not (tmp_path / "x.bin").exists()


# 4: one line naming the field or the file, never a traceback


def test_a_malformed_override_names_it():
    from rl_core.schema.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"override 'train.lr=\[1,': its value is not valid YAML"):
        load_config(ROOT / "configs/smoke.yaml", ["train.lr=[1,"])


@pytest.mark.parametrize("value", ["[]", "[0]", "[-1]"])
def test_pass_k_is_non_empty_and_each_at_least_one(value):
    from rl_core.schema.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"eval\.pass_k"):
        load_config(ROOT / "configs/smoke.yaml", [f"eval.pass_k={value}"])


def test_a_huge_bad_value_is_shown_cut():
    from rl_core.schema.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/smoke.yaml", ["experiment.seed=[" + ",".join(["12345"] * 5000) + "]"])
    assert "experiment.seed" in str(e.value) and len(str(e.value)) < 1000


@pytest.mark.parametrize("record", ["[]", "null", '{"run_id": "r1"}', '{"config": {}, "config_hash": 1}'])
def test_a_run_record_of_the_wrong_shape_is_an_artifact_error_naming_it(record, tmp_path):
    from rl_core.artifacts.store import ArtifactError, Store
    from rl_core.run.runs import load_run

    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "run.json").write_text(record)
    with pytest.raises(ArtifactError, match=r"run record .*r1/run\.json"):
        load_run(Store(str(tmp_path)), "r1")


def test_the_program_ends_a_config_or_artifact_error_in_one_line(tmp_path, state_dir, capsys):
    (tmp_path / "r1").mkdir()
    record = {"run_id": "r1", "config": {"train": {"lr": "abc"}}, "config_hash": "h", "base_id": "b"}
    (tmp_path / "r1" / "run.json").write_text(json.dumps(record))
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "run.json").write_text("[]")
    for run, names in (("r1", ("invalid config", "train.lr")), ("r2", ("r2/run.json",))):
        with pytest.raises(SystemExit) as e:
            app(["show", run, "--store", str(tmp_path)], prog_name="rlfoundry")
        assert e.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and all(n in lines[0] for n in names), lines


def test_show_renders_odd_metrics_as_dashes():
    from rich.console import Console

    from rl_core.pipeline.show import render

    stages = {
        "score_rewards": {"status": "committed", "metrics": {"mean_reward": "high"}},
        "train": {"status": "committed", "metrics": {"kl": None}, "seconds": "x"},
        "evaluate": {"status": "committed", "metrics": {}},
        "vitals": {
            "status": "committed",
            "metrics": {"alarm_list": [1, {"message": "no name"}], "length_mean": []},
        },
    }
    data = {"run_id": "r", "iterations_committed": 1, "iterations_planned": 1, "stages": list(stages),
            "base": {"warmup": {}, "evaluate": {"metrics": {"accuracy": "?"}}},
            "iterations": [{"iteration": 1, "stages": stages, "policy_sha256": 7}]}  # fmt: skip
    console = Console(width=170, record=True, color_system=None)
    console.print(render(data, stages=True, vitals=True, sha=True))
    row = next(line for line in console.export_text().splitlines() if line.strip().startswith("1 "))
    assert row.split()[:5] == ["1", "-", "-", "-", "-"]


def test_lineage_names_a_train_manifest_without_its_checkpoint(tmp_path):
    from rl_core.artifacts.manifest import Manifest
    from rl_core.artifacts.store import ArtifactError, Store
    from rl_core.pipeline.inspect_run import lineage

    store = Store(str(tmp_path))
    fields = {"stage": "x", "run_id": "r1", "iteration": 1, "config_hash": "h", "code_version": "c",
              "seeds": {}, "inputs": {}, "outputs": {},
              "timings": {"seconds": 1.0, "started_at": 1.0}}  # fmt: skip
    for stage in ("train", "score_rewards"):
        data = {k: v for k, v in fields.items() if k in Manifest.model_fields} | {"stage": stage}
        store.write_manifest(store.stage_uri("r1", 1, stage), Manifest.model_validate(data))
    with pytest.raises(
        ArtifactError, match=r"manifest .*r1/iter-0001/(train|score_rewards)/_manifest.json has no"
    ):
        lineage(store, "r1", 1)


@pytest.mark.parametrize("text", ["[1, 2]", '{"model_type": "llama", "voc'])
def test_a_folder_config_json_that_is_not_an_object_names_the_file(text, tmp_path):
    from rl_core.models.policy_folder import ModelFolderError
    from rl_core.models.vision import family

    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelFolderError, match=r"config\.json"):
        family(tmp_path)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["rollouts", "r1", "--iteration", "1", "-k", "-1"], ("-k",)),
        (["report", "r1", "-k", "-2"], ("-k",)),
        (["eval", "r1", "--iteration", "-3"], ("--iteration",)),
        (["score", "humaneval", "--completions", "x.jsonl", "--workers", "-1"], ("--workers",)),
    ],
)
def test_negative_counts_are_refused_at_the_option(args, names):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and all(n in res.output for n in names), res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("timeout", ["inf", "nan", "0"])
def test_sandbox_exec_wants_a_finite_positive_timeout(timeout, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("print(1)")
    _refused(["sandbox", "exec", str(prog), "--timeout", timeout], "--timeout", "finite")


def test_score_humaneval_names_a_binary_completions_file(tmp_path):
    samples = tmp_path / "bin.jsonl"
    samples.write_bytes(b"\xff\xfe\x00garbage")
    _refused(["score", "humaneval", "--completions", str(samples)], str(samples), "UTF-8")


def test_eval_of_a_missing_folder_says_so(tmp_path):
    _refused(["eval", str(tmp_path / "no" / "folder"), "--iteration", "1"], "no such folder")


# 5: an unreachable object store under a checkpoint folder is StoreUnavailable, not a traceback


def test_an_unreachable_s3_checkpoint_folder_is_store_unavailable(monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    import rl_core.models.policy_folder as policy_folder
    from rl_core.artifacts.retries import StoreUnavailable

    class Fs:
        def isdir(self, path):
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")

    monkeypatch.setattr(policy_folder, "_fs", lambda path: (Fs(), path.split("://", 1)[1]))
    with pytest.raises(StoreUnavailable, match=r"model.path s3://\*\*\*@bucket/ckpt: the object store"):
        policy_folder._files("s3://AKIA:secret@bucket/ckpt")
