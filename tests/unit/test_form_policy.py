"""The Prefect form's policy (flows/form_policy.py): every field that names a store, a path, a server or code
is held to what ``rlfoundry serve`` allowed — by the flow's own check of the raw parameters (before anything
is imported) and by the parameter schema the Prefect server enforces (checked here with Prefect's own
validator). Through the REST API of a served deployment: tests/integration/test_serve.py."""

from __future__ import annotations

import re
import sys

import pytest
from prefect.utilities.schema_tools.validation import validate

from flows.deployments import deployments
from flows.form_policy import FormPolicy, PolicyError
from rl_core.schema.config import load_config

SERVED = load_config("configs/smoke.yaml")


def _raw(**changes) -> dict:
    """The served config as the form sends it, with ``section.field`` changes."""
    data = SERVED.model_dump(mode="json")
    for dotted, value in changes.items():
        *sections, name = dotted.split("__")
        target = data
        for s in sections:
            target = target[s]
        target[name] = value
    return data


def _policy(tmp_path, **kw) -> FormPolicy:
    return FormPolicy.served(SERVED, store="", roots=[str(tmp_path / "models"), "s3://models/team"], **kw)


# (change, the field the refusal must name)
REFUSED = [
    ({"store__uri": "file:///etc"}, "config.store.uri"),
    ({"store__uri": "s3://someone-elses-bucket/x"}, "config.store.uri"),
    ({"model__path": "/etc"}, "config.model.path"),
    ({"model__path": "{models}/../../etc"}, "config.model.path"),  # climbs out of the allowed root
    ({"model__path": "{models}/link-out"}, "config.model.path"),  # a symlink out of the root
    ({"model__path": "s3://models/team/../other/m"}, "config.model.path"),
    ({"model__path": "s3://models/teammate/m"}, "config.model.path"),  # a prefix of the root, not under it
    ({"reward__model__path": "/root/.ssh"}, "config.reward.model.path"),
    ({"reward__judge__model": "/var/lib"}, "config.reward.judge.model"),
    ({"task__env": "os:system"}, "config.task.env"),
    ({"task__env": "tests.unit.planted_payload:Env"}, "config.task.env"),
    (
        {"reward__weights": {"correct": 1.0, "subprocess:call": 1.0}},
        "config.reward.weights['subprocess:call']",
    ),
    ({"rollout__server_urls": ["http://169.254.169.254/latest"]}, "config.rollout.server_urls[0]"),
    ({"reward__model__url": "http://attacker.example:80"}, "config.reward.model.url"),
    ({"tracking__mlflow_uri": "sqlite:////tmp/elsewhere.db"}, "config.tracking.mlflow_uri"),
    # a Ray cluster is sent the run's weights, data and code; what it returns is unpickled on the worker
    ({"task__ray_address": "ray://attacker.example:10001"}, "config.task.ray_address"),
    ({"cluster__ray_address": "auto"}, "config.cluster.ray_address"),
    ({"model__path": "~root/.cache"}, "config.model.path"),  # ~ is expanded where the config is read
    # an inspect-ai task file is code the sweep's worker runs: the form names built-in tasks only
    ({"eval__inspect": {"x": {"task": "/tmp/payload.py"}}}, "config.eval.inspect.x.task"),
    ({"eval__inspect": {"x": {"task": "infra/inspect/qa_task.py@qa"}}}, "config.eval.inspect.x.task"),
    ({"eval__inspect": {"x": {"task": "qa", "dataset": "/etc/passwd"}}}, "config.eval.inspect.x.dataset"),
    ({"eval__inspect": {"x": {"dataset": "{models}/../../etc/passwd"}}}, "config.eval.inspect.x.dataset"),
]


def _fill(change: dict, tmp_path) -> dict:
    models = str(tmp_path / "models")
    return {k: (v.replace("{models}", models) if isinstance(v, str) else v) for k, v in change.items()}


@pytest.mark.parametrize("change,field", REFUSED, ids=[f for _, f in REFUSED])
def test_the_flow_refuses_what_the_policy_does_not_allow(tmp_path, change, field):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "link-out").symlink_to("/etc")
    with pytest.raises(PolicyError) as e:
        _policy(tmp_path).check(_raw(**_fill(change, tmp_path)))
    assert str(e.value).startswith(field), e.value
    assert "allowed" in str(e.value)  # the rule: what would have been accepted


@pytest.mark.parametrize("change,field", REFUSED, ids=[f for _, f in REFUSED])
def test_the_server_schema_refuses_the_same(tmp_path, change, field):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "link-out").symlink_to("/etc")
    schema = deployments(SERVED, sweep_runs=[], sweep_cron="0 3 * * *", store="", policy=_policy(tmp_path))[0]
    schema = schema._parameter_openapi_schema.model_dump()
    errors = validate({"config": _raw(**_fill(change, tmp_path)), "run_id": ""}, schema, ignore_required=True)
    if "link-out" in str(change):  # a symlink is the flow's to resolve: the schema sees a path under the root
        assert errors == []
        return
    assert errors, (change, "accepted by the schema")
    path = ".".join(str(p) for p in errors[0].path)
    want = field.split("[")[0]
    assert path == want or path.startswith(want + "."), (path, field)


def test_what_the_policy_allows_passes_both(tmp_path):
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    policy = _policy(tmp_path, envs=["mypkg.envs:MyEnv"], urls=["http://10.0.0.5:8000"])
    schema = deployments(SERVED, sweep_runs=[], sweep_cron="0 3 * * *", store="", policy=policy)[0]
    schema = schema._parameter_openapi_schema.model_dump()
    for change in (
        {},
        {"model__path": str(tmp_path / "models" / "qwen")},
        {"model__path": "s3://models/team/qwen3-8b"},
        {"task__env": "countup"},
        {"task__env": "mypkg.envs:MyEnv"},  # named by the operator
        {"reward__weights": {"correct": 1.0, "partial": 0.5}},
        {"rollout__server_urls": ["http://10.0.0.5:8000"]},
        {
            "eval__inspect": {
                "held": {"task": "qa"},
                "mine": {"dataset": str(tmp_path / "models" / "q.jsonl")},
            }
        },
    ):
        raw = _raw(**change)
        policy.check(raw)
        assert validate({"config": raw, "run_id": ""}, schema, ignore_required=True) == [], change


def test_refused_code_is_never_imported(tmp_path, monkeypatch):
    (tmp_path / "planted_mod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('payload')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for change in ({"task__env": "planted_mod:Env"}, {"reward__weights": {"planted_mod:fn": 1.0}}):
        with pytest.raises(PolicyError):
            _policy(tmp_path).check(_raw(**change))
    assert "planted_mod" not in sys.modules and not (tmp_path / "ran").exists()


def test_the_sweep_and_replay_store_is_held_too():
    policy = FormPolicy.served(SERVED, store="s3://runs/prod")
    policy.check_store("s3://runs/prod")
    with pytest.raises(PolicyError, match=r"^store='s3://other/x': not a store"):
        policy.check_store("s3://other/x")
    deps = deployments(SERVED, sweep_runs=[], sweep_cron="0 3 * * *", store="s3://runs/prod", policy=policy)
    for d in deps[1:]:
        schema = d._parameter_openapi_schema.model_dump()
        assert validate({"store": "s3://other/x"}, schema, ignore_required=True)
        assert validate({"store": "s3://runs/prod"}, schema, ignore_required=True) == []
    assert FormPolicy.of_schema(deps[0]._parameter_openapi_schema.model_dump()) == policy


def test_a_datasets_files_are_held_to_the_roots(tmp_path):
    (tmp_path / "models").mkdir()
    policy = _policy(tmp_path)
    args = {"train": "/etc/passwd", "heldout_fraction": 0.1}
    with pytest.raises(PolicyError, match=r"^config\.task\.env_args\.train='/etc/passwd': not a path"):
        policy.check(_raw(task__env="dataset", task__env_args=args))
    inside = {"train": str(tmp_path / "models" / "train.jsonl"), "heldout_fraction": 0.1}
    policy.check(_raw(task__env="dataset", task__env_args=inside))


def test_a_config_that_is_not_an_object_is_refused():
    with pytest.raises(PolicyError, match="^config: expected"):
        FormPolicy.served(SERVED).check(["not", "a", "config"])  # type: ignore[arg-type]


def test_the_form_offers_exactly_the_rewards_the_library_registers():
    """The form's built-in reward names come from the schema's declaration (no registry import); the score
    stage registers a function under each of them and under no other."""
    from flows.form_policy import builtin_rewards
    from rl_core.schema.config_reward import BUILTIN_REWARDS
    from rl_core.scoring.rewards import _BATCH, _BUILTIN, builtin

    assert set(_BUILTIN) | set(_BATCH) == set(BUILTIN_REWARDS)
    assert set(BUILTIN_REWARDS) <= set(builtin_rewards())
    with pytest.raises(ValueError, match="declare it in rl_core.schema.config_reward"):
        builtin("undeclared")


def test_the_sweeps_inspect_tasks_are_held_too(tmp_path):
    """The evaluation sweep's own ``inspect`` parameter: built-in tasks only, datasets under the roots, by
    the flow's check and by the sweep deployment's schema."""
    policy = _policy(tmp_path)
    with pytest.raises(PolicyError, match=r"^inspect\.x\.task='/tmp/payload\.py': a task file is code"):
        policy.check_inspect({"x": {"task": "/tmp/payload.py"}}, "inspect")
    with pytest.raises(PolicyError, match=r"^inspect\.x\.dataset='/etc/passwd': not a path"):
        policy.check_inspect({"x": {"dataset": "/etc/passwd"}}, "inspect")
    policy.check_inspect({"x": {"dataset": str(tmp_path / "models" / "q.jsonl")}}, "inspect")
    sweep = deployments(SERVED, sweep_runs=[], sweep_cron="0 3 * * *", store="", policy=policy)[1]
    schema = sweep._parameter_openapi_schema.model_dump()
    bad = validate({"inspect": {"x": {"task": "/tmp/payload.py"}}}, schema, ignore_required=True)
    assert bad and all(".".join(map(str, e.path)).startswith("inspect") for e in bad)  # (anyOf: dict | None)
    assert validate({"inspect": {"x": {"task": "qa"}}}, schema, ignore_required=True) == []


def test_a_home_folder_is_not_a_way_out_of_the_roots(tmp_path, monkeypatch):
    """``~/secret.jsonl`` with a root that holds the worker's working folder: the check compared the path
    unexpanded (under the root, relative to it), the dataset then read the home folder's file."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret.jsonl").write_text('{"prompt": "p", "answer": "1"}\n')
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the root holds the worker's working folder, not the home folder
    policy = FormPolicy.served(SERVED, store="", roots=["."])
    for path in ("~/secret.jsonl", f"~{__import__('getpass').getuser()}/x"):
        raw = _raw(task__env="dataset", task__env_args={"train": path, "heldout_fraction": 0.1})
        with pytest.raises(PolicyError, match=r"config\.task\.env_args\.train"):
            policy.check(raw)


def test_server_urls_that_are_no_list_are_refused_naming_the_field(tmp_path):
    for given in (5, "http://x", [1]):
        with pytest.raises(PolicyError, match="config.rollout.server_urls=.*expected a list of URLs"):
            _policy(tmp_path).check(_raw(rollout__server_urls=given))


def test_the_experiment_flow_makes_every_config_check(tmp_path, monkeypatch):
    """The flow validated the form's config with the model alone: a config load_config refuses (heads that
    do not divide the width, eval.samples below pass@k) was accepted and recorded, and then broke every
    evaluation sweep of the store."""
    from flows.deployments import experiment
    from rl_core.schema.config import ConfigError

    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(tmp_path))
    for change, said in (
        ({"model__num_heads": 3}, "model.num_heads: must divide model.hidden_size"),
        ({"eval__samples": 1}, "eval.samples: must be >= max(eval.pass_k)"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            experiment.fn(config=_raw(**change), run_id="heads3")
    assert not (tmp_path / "store" / "heads3").exists()


def test_a_sweep_lists_a_run_it_cannot_read_and_goes_on(tmp_path):
    from flows.deployments import _sweep_runs
    from rl_core.artifacts.store import Store

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text('{"run_id": "bad", "conf')
    out, unswept = _sweep_runs(Store(str(tmp_path)), ["bad", "gone"], {})
    assert out == {} and sorted(unswept) == ["bad", "gone"]
    assert "corrupt JSON" in unswept["bad"] and "no run 'gone'" in unswept["gone"]
