"""Your own model as the policy, end to end: a Llama folder written here (an architecture, a tokenizer, a chat
template and EOS ids unlike the built-in policy's; tied embeddings, saved in shards with an index) trained by
RL on vLLM + DeepSpeed through `rlfoundry run`, killed and resumed to the same weights, and replayed stage
by stage; a bad folder stops `run` with exit 2."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import replay_cli, run_cli, show_json
from tests.model_folders import EOT, write_llama_folder

ITERATIONS = 2


def _args(folder: Path, run_id: str) -> list[str]:
    return [
        "run",
        "configs/smoke.yaml",
        "--run-id",
        run_id,
        "--set",
        f"model.path={folder}",
        "--set",
        "model.max_position=48",
        "--set",
        f"experiment.iterations={ITERATIONS}",
        "--set",
        "tracking.enabled=false",
        "--set",
        "model.max_shard_size=40KB",  # the run's own checkpoints sharded too
    ]


def _show(state: Path, run_id: str) -> dict:
    return show_json(state, run_id)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tied_sharded_folder(out: Path) -> Path:
    """A tied Llama folder saved in 40 KB shards with its index (tied as Qwen2.5/Qwen3/Llama-3.2 ship; sharded
    as every model above save_pretrained's max_shard_size is saved)."""
    from transformers import AutoModelForCausalLM

    whole = write_llama_folder(out.with_name(out.name + "-whole"), tie=True)
    out.mkdir(parents=True)
    for f in whole.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    AutoModelForCausalLM.from_pretrained(str(whole)).save_pretrained(out, max_shard_size="40KB")
    return out


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    folder = tied_sharded_folder(tmp_path_factory.mktemp("model") / "llama")
    state = tmp_path_factory.mktemp("state")
    r = run_cli(_args(folder, "own"), state)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return folder, state


def _uri_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


@pytest.mark.slow
def test_the_folder_is_the_base_policy_unchanged(own_run):
    folder, state = own_run
    data = _show(state, "own")
    init = _uri_path(data["base"]["init"]["artifacts"]["checkpoint"])
    assert {f.name: _sha(f) for f in init.iterdir()} == {f.name: _sha(f) for f in folder.iterdir()}
    # every later checkpoint is the same folder with new weights
    for it in data["iterations"]:
        ckpt = _uri_path(it["stages"]["train"]["artifacts"]["checkpoint"])
        from rl_core.models.model import is_weight_file

        assert {f.name for f in ckpt.iterdir() if not is_weight_file(f.name)} == {
            f.name for f in folder.iterdir() if not is_weight_file(f.name)
        }
        for f in folder.iterdir():
            if not is_weight_file(f.name):
                assert _sha(ckpt / f.name) == _sha(f), f.name


@pytest.mark.slow
def test_rl_on_vllm_and_deepspeed_with_the_models_own_template_and_eos(own_run):
    from transformers import PreTrainedTokenizerFast

    folder, state = own_run
    data = _show(state, "own")
    assert data["iterations_committed"] == ITERATIONS
    hashes = [it["policy_sha256"] for it in data["iterations"]]
    assert len(set(hashes)) == ITERATIONS  # the weights moved every iteration
    for it in data["iterations"]:
        assert it["stages"]["train"]["metrics"]["logprob_mismatch_max"] < 1e-3
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    eos = {tok.eos_token_id, tok.convert_tokens_to_ids(EOT)}
    df = pd.read_parquet(state / "store" / "own" / "iter-0001" / "generate" / "rollouts.parquet")
    for p, text in zip(df["prompt_ids"], df["prompt"], strict=True):
        assert tok.decode(p) == f"<s>[INST]{text}[/INST]"  # rendered with the folder's chat template
    stopped = df[df["finish_reason"] == "stop"]
    assert len(stopped) > 0
    assert all(int(c[-1]) in eos for c in stopped["completion_ids"])
    # generation ends at the first of the model's EOS ids, whichever it is
    assert not any(set(map(int, c[:-1])) & eos for c in df["completion_ids"])


REPLAYED = ["generate", "train", "evaluate"]


@pytest.fixture(scope="module")
def replays(own_run):
    """The last iteration's stages replayed by one `rlfoundry replay` process."""
    _, state = own_run
    r = replay_cli(state, "own", ITERATIONS, REPLAYED)
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("stage", REPLAYED)
def test_replay_reproduces_the_stage(replays, stage):
    report = replays["stages"][stage]
    assert report["identical"] is True and report["artifacts"], report


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(own_run):
    folder, state = own_run  # the same state folder: the run starts from the shared warmed-up base
    want = [it["policy_sha256"] for it in _show(state, "own")["iterations"]]
    killed = run_cli(_args(folder, "k"), state, env={"RLFOUNDRY_FAULT": "train:outputs@2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run_cli(["resume", "k"], state)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [it["policy_sha256"] for it in _show(state, "k")["iterations"]] == want


@pytest.mark.slow  # an rlfoundry process
def test_a_bad_folder_stops_run_before_any_work(tmp_path):
    folder = write_llama_folder(tmp_path / "llama")
    (folder / "tokenizer.json").unlink()
    r = run_cli(_args(folder, "bad"), tmp_path / "state", timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"model.path {folder}: no tokenizer (tokenizer.json)" in r.stderr
    assert not (tmp_path / "state" / "store" / "bad").exists()
    # `eval` checks a folder as `run` does; a folder needs the config naming its task
    r = run_cli(["eval", str(folder), "--config", "configs/smoke.yaml"], tmp_path / "state", timeout=300)
    assert r.returncode == 2 and f"model.path {folder}: no tokenizer (tokenizer.json)" in r.stderr
    r = run_cli(["eval", str(folder), "--iteration", "1"], tmp_path / "state", timeout=300)
    assert r.returncode == 2 and "is a checkpoint folder: give --config CONFIG" in r.stderr


@pytest.mark.slow
def test_no_warmup_on_the_hf_engine(own_run, tmp_path):
    """warmup.steps 0: the folder itself is the base policy; the HF fallback engine samples it."""
    folder, _ = own_run
    args = _args(folder, "plain") + ["--set", "warmup.steps=0", "--set", "rollout.engine=hf"]
    args[args.index(f"experiment.iterations={ITERATIONS}")] = "experiment.iterations=1"
    r = run_cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = _show(tmp_path, "plain")
    base = data["base"]
    assert base["warmup"]["artifacts"]["checkpoint"] == base["init"]["artifacts"]["checkpoint"]
    from rl_core.models.model import weights_digest

    assert base["policy_sha256"] == weights_digest({f.name: _sha(f) for f in folder.iterdir()})  # its shards
    (it,) = data["iterations"]
    assert it["stages"]["train"]["metrics"]["logprob_mismatch_max"] < 1e-3
    # `rlfoundry eval FOLDER` measures the folder itself outside any run: the run's base policy, by digest,
    # with the base evaluation's figures (the same seeded samples), and writes nothing into the run
    sets = args[args.index("--run-id") + 2 :]
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store" / "plain").rglob("*"))
    r = run_cli(["eval", str(folder), "--config", "configs/smoke.yaml", "--json", *sets], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["policy_sha256"] == base["policy_sha256"] and "/_replay/_eval/" in got["policy"]
    measured = {k: v for k, v in base["evaluate"]["metrics"].items() if k in got["metrics"]}
    assert {"accuracy", "pass@1", "pass@4", "mean_reward", "problems"} <= set(measured)
    assert got["metrics"] == measured
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "store" / "plain").rglob("*")) == before


@pytest.mark.slow
def test_tied_sharded_weights_stay_tied_and_the_engine_follows_every_update(own_run):
    """The module's folder is tied and sharded: trained as one tensor, saved tied (no lm_head.weight, the
    config's tie kept) in shards of ``model.max_shard_size``, and vLLM — whose reload never re-ties — samples
    from the new head after every sync (the logprob gap checked above stays at float rounding)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rl_core.models.model import INDEX, weights_digest

    folder, state = own_run
    assert (folder / INDEX).exists() and not (folder / "model.safetensors").exists()
    shown = _show(state, "own")
    last = state / "store" / "own" / f"iter-{ITERATIONS:04d}" / "train" / "checkpoint"
    assert json.loads((last / "config.json").read_text())["tie_word_embeddings"] is True
    index = json.loads((last / INDEX).read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) > 1 and not (last / "model.safetensors").exists() and "lm_head.weight" not in index
    for shard in shards:
        with safe_open(str(last / shard), "pt") as f:
            assert "lm_head.weight" not in list(f.keys())
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in last.iterdir() if p.is_file()}
    assert shown["iterations"][-1]["policy_sha256"] == weights_digest(files)  # the index and every shard
    model = AutoModelForCausalLM.from_pretrained(str(last))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # one shared tensor
    base = AutoModelForCausalLM.from_pretrained(str(folder))
    assert not (model.model.embed_tokens.weight == base.model.embed_tokens.weight).all()  # and it was trained
