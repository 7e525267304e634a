"""The config schema: every shipped file validates; bad values fail before any work, naming the field."""

from pathlib import Path

import pytest

from rl_core.schema.config import ConfigError, config_hash, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_exist():
    assert any(p.name == "default.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path):
    cfg = load_config(path)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each config starts with a comment"
    assert "rlfoundry run" in path.read_text(), "each config names the command that runs it"
    assert cfg.experiment.iterations >= 1

    # its environment can draw the task sets it asks for (a config that cannot start is caught here)
    from envs.base import make_env

    env = make_env(cfg.task.env, cfg.task.env_args)
    for split, size in (("train", cfg.task.train_size), ("heldout", cfg.task.heldout_size)):
        assert len(env.tasks(split, cfg.task, cfg.experiment.seed)) == size
    assert cfg.warmup.examples <= cfg.task.train_size or cfg.warmup.steps == 0


def test_set_overrides_any_field():
    cfg = load_config(
        None, ["train.lr=3e-5", "rollout.engine=hf", "task.env_args.operations=[mul]", "experiment.name=x"]
    )
    assert cfg.train.lr == 3e-5
    assert cfg.rollout.engine == "hf"
    assert cfg.task.env_args == {"operations": ["mul"], "digits": [1, 2]}  # the others keep defaults
    assert cfg.experiment.name == "x"


def test_bad_literal_names_field_and_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.engine=tgi"])
    msg = str(e.value)
    assert "rollout.engine" in msg and "'vllm'" in msg and "'hf'" in msg and "tgi" in msg


def test_out_of_range_value_names_field():
    with pytest.raises(ConfigError, match=r"train\.zero_stage"):
        load_config(None, ["train.zero_stage=4"])
    with pytest.raises(ConfigError, match=r"rollout\.temperature"):
        load_config(None, ["rollout.temperature=-1"])


def test_unknown_field_is_refused_with_known_names():
    with pytest.raises(ConfigError, match=r"unknown config field 'train\.learning_rate'.*lr"):
        load_config(None, ["train.learning_rate=1"])
    with pytest.raises(ConfigError, match="unknown config field 'nosuch'"):
        load_config(None, ["nosuch.x=1"])


def test_unknown_field_in_file_is_refused(tmp_path: Path):
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"train\.lrr"):
        load_config(p)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="model.num_heads"):
        load_config(None, ["model.hidden_size=100", "model.num_heads=3"])
    with pytest.raises(ConfigError, match="eval.samples"):
        load_config(None, ["eval.pass_k=[1,16]", "eval.samples=8"])


def test_every_field_is_described():
    from pydantic import BaseModel

    from rl_core.schema.config import Config

    def walk(model: type[BaseModel], prefix: str = ""):
        for name, f in model.model_fields.items():
            assert f.description, f"{prefix}{name} has no description"
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")

    walk(Config)


def test_config_hash_changes_with_content():
    assert config_hash(load_config()) == config_hash(load_config())
    assert config_hash(load_config()) != config_hash(load_config(None, ["train.lr=1e-5"]))


def test_apply_overrides_refuses_unknown_fields():
    from rl_core.schema.config import apply_overrides

    data = apply_overrides({"train": {"lr": 0.1}}, ["train.lr=0.2", "rollout.n=4"])
    assert data == {"train": {"lr": 0.2}, "rollout": {"n": 4}}
    with pytest.raises(ConfigError, match="unknown config field 'train.nope'"):
        apply_overrides({}, ["train.nope=1"])


def test_old_schema_fields_name_their_new_home(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("task:\n  env: arithmetic\n  digits: [3]\nreward:\n  correct_weight: 1.0\n")
    with pytest.raises(ConfigError, match=r"task\.digits moved: set task\.env_args\.digits instead"):
        load_config(old)
    old.write_text("reward:\n  format_weight: 0.2\n")
    with pytest.raises(ConfigError, match=r"reward\.format_weight moved: set reward\.weights\.format"):
        load_config(old)


def test_env_args_are_the_environments_and_filled_in():
    cfg = load_config(None, ["task.env=countup"])
    assert cfg.task.env_args == {"digits": [4]}  # countup's own default, not arithmetic's
    with pytest.raises(ConfigError, match=r"task\.env_args\.operations: not an option of CountUpOptions"):
        load_config(None, ["task.env=countup", "task.env_args.operations=[add]"])
    with pytest.raises(ConfigError, match="environment 'tooluse' takes no options"):
        load_config(None, ["task.env=tooluse", "task.env_args.digits=[1]"])
    with pytest.raises(ConfigError, match="unknown reward function 'nope'"):
        load_config(None, ["reward.weights.nope=1.0"])
    weights = load_config(None, ["reward.weights.partial=0.5"]).reward.weights
    assert weights == {"correct": 1.0, "format": 0.1, "partial": 0.5}


@pytest.mark.parametrize(
    "override, why",
    [
        ("rollout.top_p=0.9", r"rollout\.top_p: .*PPO ratio would compare two different distributions"),
        ("rollout.top_p=0.999", r"rollout\.top_p: .*must be 1\.0"),
        ("rollout.temperature=0", r"rollout\.temperature: .*greedy decoding is for evaluation"),
        ("rollout.temperature=0.0", r"rollout\.temperature: .*NaN loss"),
    ],
)
def test_sampling_the_trainer_cannot_match_is_refused_with_the_reason(override, why):
    """Issue 21 item 6: a truncated sampler (top-p) or greedy decoding cannot be trained on as configured."""
    with pytest.raises(ConfigError, match=why):
        load_config(None, [override])
    assert load_config(None, ["rollout.temperature=0.7", "eval.temperature=0"]).rollout.temperature == 0.7


def test_the_hf_engine_samples_in_the_dtype_asked_for(tmp_path):
    """Issue 21 item 6: rollout.dtype was ignored by the HF engine; bf16 sampling now runs in bf16."""
    import torch

    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec
    from tests.conftest import two_policies

    tok, a, _ = two_policies(tmp_path)
    prompt = tok("1 2 3", add_special_tokens=False)["input_ids"]
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=3)
    for dtype, want in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        engine = HFEngine(a, dtype=dtype)
        assert {p.dtype for p in engine.model.parameters()} == {want}
        (done,) = engine.generate([Request(prompt, seed=3)], spec)
        assert len(done) == 2 and all(len(c.token_ids) >= 1 for c in done)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("train:\n  lr: 0.1\ntrain:\n  epochs: 2\n", "the key 'train' is given twice"),
        ("train:\n  lr: 0.1\n  lr: 0.5\n", "the key 'lr' is given twice"),
        ("\ufefftrain: {lr: 0.1}\n".encode("utf-16"), "cannot be read as UTF-8 text"),
        (None, "cannot be read as UTF-8 text"),  # a folder
        ("false\n", "must hold a mapping of sections, not False"),  # loaded the defaults before
        ("0\n", "must hold a mapping of sections, not 0"),
        ("experiment: {seed: " + "9" * 5000 + "}\n", "cannot be read: Exceeds the limit"),  # a raw ValueError
        ("train: " + "[" * 5000 + "]" * 5000 + "\n", "cannot be read: maximum recursion depth"),
    ],
    ids=["section_twice", "field_twice", "utf16", "folder", "false", "zero", "5000_digits", "deep"],
)
def test_a_config_file_that_says_two_things_or_cannot_be_read_is_refused(tmp_path, text, says):
    path = tmp_path / "c.yaml"
    if text is None:
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_config(path)


def test_yaml_merge_keys_may_set_a_key_again(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  <<: {lr: 0.001, epochs: 3}\n  lr: 0.002\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.epochs) == (0.002, 3)


@pytest.mark.parametrize(
    "override",
    ["train.kl_coef=.inf", "train.weight_decay=.nan", "train.lr=-.inf", "experiment.name=team/arith",
     "experiment.name=a:b", "experiment.name="],
)  # fmt: skip
def test_non_finite_numbers_and_names_mlflow_refuses_fail_at_load(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])


SECRET = "FAKESECRET123"


@pytest.mark.parametrize(
    "override, field",
    [
        (f"tracking.mlflow_uri=http://alice:{SECRET}@127.0.0.1:5055", "tracking.mlflow_uri"),
        (f"tracking.mlflow_uri=https://{SECRET}@mlflow.example", "tracking.mlflow_uri"),  # a token as user
        (f'rollout.server_urls=["http://127.0.0.1:8000", "http://u:{SECRET}@127.0.0.1:1"]', "urls[1]"),
        (f"reward.model.url=http://rm:{SECRET}@127.0.0.1:9000", "reward.model.url"),
    ],
)
def test_a_url_with_credentials_is_refused_without_repeating_them(override, field):
    """The config is logged whole (MLflow params, run.json, Prefect's parameters, the report): a password in
    one of its URLs was stored in all of them and printed by MLflow."""
    with pytest.raises(ConfigError) as e:
        load_config("configs/smoke.yaml", [override])
    said = str(e.value)
    assert field in said and "credentials" in said and "MLFLOW_TRACKING_PASSWORD" in said
    assert SECRET not in said


def test_urls_without_credentials_and_at_signs_elsewhere_load():
    cfg = load_config(
        "configs/smoke.yaml",
        ["tracking.mlflow_uri=http://127.0.0.1:5055", "experiment.name=at-home"],
    )
    assert cfg.tracking.mlflow_uri == "http://127.0.0.1:5055"
    # a database user without a password (its password from PGPASSWORD or the server's own trust) is no secret
    db = "postgresql://mlflow@db/mlflow"
    assert load_config("configs/smoke.yaml", [f"tracking.mlflow_uri={db}"]).tracking.mlflow_uri == db


def test_the_s3_endpoint_is_named_without_its_credentials(monkeypatch):
    from rl_core.artifacts.retries import s3_endpoint

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://minio:{SECRET}@127.0.0.1:9000")
    assert s3_endpoint() == "http://***@127.0.0.1:9000"


def test_an_alias_bomb_in_a_field_is_refused_without_expanding_it(tmp_path):
    """Ten nested anchors of ten aliases each (10^10 strings once expanded) in a list field: the error
    message repeated the value's repr in full before cutting it (hours); now its first levels and items."""
    import threading

    anchors = "".join(
        f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10 if i else ["q"] * 10) + "]\n" for i in range(10)
    )
    path = tmp_path / "bomb.yaml"
    path.write_text(anchors + "rollout:\n  curriculum_keys: [*a9, *a9]\n")
    said: list[str] = []

    def load() -> None:
        try:
            load_config(path)
        except ConfigError as e:
            said.append(str(e))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the config's error message was still being written after 30 s"
    assert "rollout.curriculum_keys.0: Input should be a valid string" in said[0]
    assert len(said[0]) < 20_000


def test_overrides_past_pythons_limits_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"override 'experiment.seed=9+.*cannot be read"):
        load_config("configs/smoke.yaml", ["experiment.seed=" + "9" * 5000])
    with pytest.raises(ConfigError, match=r"override 'train.lr=\[+.*cannot be read"):
        load_config("configs/smoke.yaml", ["train.lr=" + "[" * 5000])


@pytest.mark.parametrize("digits", [0, 33, 400])
def test_arithmetic_digits_past_what_an_answer_can_hold_are_refused_at_load(digits):
    """400 loaded and failed later with a bare OverflowError; 33..64 loaded and could never be answered."""
    with pytest.raises(ConfigError, match=r"task\.env_args.*digits"):
        load_config("configs/smoke.yaml", [f"task.env_args.digits=[{digits}]"])
