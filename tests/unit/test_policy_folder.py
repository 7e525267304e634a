"""Your own model folder as the policy (``model.path``): each bad folder is refused before any work, naming
the path and what is wrong; a good one goes into the store unchanged; prompts use its chat template;
generation stops at its own EOS ids. No engine is started here (vLLM's registry is imported, not run)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rl_core.models.model import build_tokenizer, load_tokenizer, prompt_ids, prompt_text, stop_ids
from rl_core.models.policy_folder import ModelFolderError, check_policy_folder
from rl_core.schema.config import ConfigError, load_config
from tests.model_folders import BOS, EOT, write_llama_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_llama_folder(tmp_path_factory.mktemp("own") / "llama")


def _copy(src: Path, dest: Path, drop: tuple[str, ...] = ()) -> Path:
    dest.mkdir()
    for f in src.iterdir():
        if f.name not in drop:
            (dest / f.name).write_bytes(f.read_bytes())
    return dest


def _refused(path: Path | str, match: str, **kw) -> str:
    with pytest.raises(ModelFolderError, match=match) as e:
        check_policy_folder(str(path), **{"vllm": False, **kw})
    assert str(path) in str(e.value)
    return str(e.value)


def test_a_good_folder_passes_with_what_it_holds(folder):
    info = check_policy_folder(str(folder), vllm=True, max_model_len=64)
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["vocab_size"] == len(load_tokenizer(folder)) and info["parameters"] > 10_000


def test_no_such_folder(tmp_path):
    _refused(tmp_path / "nowhere", "no such folder")


def test_no_config(folder, tmp_path):
    _refused(_copy(folder, tmp_path / "x", drop=("config.json",)), "no config.json")


def test_no_tokenizer(folder, tmp_path):
    _refused(_copy(folder, tmp_path / "x", drop=("tokenizer.json",)), r"no tokenizer \(tokenizer.json\)")


def test_no_weights(folder, tmp_path):
    bare = _copy(folder, tmp_path / "x", drop=("model.safetensors",))
    _refused(bare, r"no weights \(model.safetensors\)$")
    (bare / "pytorch_model.bin").write_bytes(b"0")
    _refused(bare, "found pytorch_model.bin: re-save with safe_serialization=True")


def _sharded(folder: Path, out: Path) -> Path:
    """``folder`` re-saved by save_pretrained in 20 KB shards with their index."""
    from transformers import AutoModelForCausalLM

    out = _copy(folder, out)
    (out / "model.safetensors").unlink()
    AutoModelForCausalLM.from_pretrained(str(folder)).save_pretrained(out, max_shard_size="20KB")
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 3
    return out


def test_sharded_weights_are_read_through_their_index(folder, tmp_path):
    whole = check_policy_folder(str(folder), vllm=True)
    sharded = _sharded(folder, tmp_path / "s")
    assert check_policy_folder(str(sharded), vllm=True)["parameters"] == whole["parameters"]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    (sharded / "model.safetensors.index.json").write_text("{}")
    _refused(sharded, "model.safetensors.index.json is not a shard index")
    gone = dict(index, weight_map={**index["weight_map"], "x.weight": "model-00099-of-00099.safetensors"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(gone))
    _refused(sharded, "names shards that are not there")
    first, second = sorted(set(index["weight_map"].values()))[:2]
    tensor = next(k for k, v in index["weight_map"].items() if v == first)
    moved = dict(index, weight_map={**index["weight_map"], tensor: second})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(moved))
    _refused(sharded, f"puts {tensor} in {second}, which does not hold it")


def test_corrupt_weights(folder, tmp_path):
    corrupt = _copy(folder, tmp_path / "c")
    (corrupt / "model.safetensors").write_bytes(b"\x05\x00")
    _refused(corrupt, "not a safetensors file")


def test_an_architecture_vllm_cannot_load(tmp_path):
    from tests.model_folders import write_biogpt_folder

    out = write_biogpt_folder(tmp_path / "biogpt")
    msg = _refused(out, "architecture BioGptForCausalLM cannot be loaded by vLLM", vllm=True)
    assert "rollout.engine=hf" in msg
    assert check_policy_folder(str(out), vllm=False)["architecture"] == "BioGptForCausalLM"


def test_a_chat_template_that_does_not_render(tmp_path):
    broken = write_llama_folder(tmp_path / "b", chat_template="{% for m in messages %}{{ m['content'] }")
    _refused(broken, "chat template does not render")
    raising = write_llama_folder(tmp_path / "r", chat_template="{{ raise_exception('no user role here') }}")
    _refused(raising, "no user role here")
    _refused(raising, "no user role here", chat_template=True)
    # not used, not rendered: a text prompt stays text
    assert check_policy_folder(str(raising), vllm=False, chat_template=False)


def test_chat_template_true_needs_one(tmp_path):
    plain = write_llama_folder(tmp_path / "p", chat_template=None)
    _refused(plain, "model.chat_template is true but the tokenizer has none", chat_template=True)
    assert check_policy_folder(str(plain), vllm=False)  # auto: plain text prompts


def test_tied_embeddings_are_accepted_and_get_an_untied_engine_view(tmp_path):
    """A tied causal LM is a policy as it is; the engine loads an untied view of it
    (rl_core.models.engine_view):
    the same files, a config without the tie, and the output embedding as a copy of the input one."""
    from safetensors import safe_open

    from rl_core.models.engine_view import HEAD_FILE, engine_folder

    tied = write_llama_folder(tmp_path / "t", tie=True)
    assert check_policy_folder(str(tied), vllm=True)
    view = engine_folder(tied)
    assert view != tied and engine_folder(write_llama_folder(tmp_path / "u")) == tmp_path / "u"
    assert json.loads((view / "config.json").read_text())["tie_word_embeddings"] is False
    assert json.loads((tied / "config.json").read_text())["tie_word_embeddings"] is True  # folder untouched
    weights = str(tied / "model.safetensors")
    with safe_open(str(view / HEAD_FILE), "pt") as head, safe_open(weights, "pt") as w:
        assert "lm_head.weight" not in list(w.keys())
        assert (head.get_tensor("lm_head.weight") == w.get_tensor("model.embed_tokens.weight")).all()
    assert engine_folder(tied) == view  # made once per set of weights


def test_threads_building_one_view_at_once_all_get_it(tmp_path):
    """A pool starting its rollout servers builds the same view from several threads of one process."""
    from concurrent.futures import ThreadPoolExecutor

    from rl_core.models.engine_view import engine_folder

    tied = write_llama_folder(tmp_path / "t", tie=True, seed=3)
    with ThreadPoolExecutor(4) as pool:
        views = list(pool.map(lambda _: engine_folder(tied), range(8)))
    assert len(set(views)) == 1 and (views[0] / ".complete").exists()
    assert not [p for p in views[0].parent.iterdir() if ".tmp-" in p.name]  # no leftovers


def test_longer_context_than_the_model_is_refused(folder):
    _refused(folder, "max_position_embeddings=128", max_model_len=512)


def test_cli_config_keeps_an_absolute_path(folder, monkeypatch):
    monkeypatch.chdir(folder.parent)
    cfg = load_config(None, ["model.path=llama"])
    assert cfg.model.path == str(folder)
    assert load_config(None, ["model.path=s3://b/m"]).model.path == "s3://b/m"
    with pytest.raises(ConfigError, match="model.chat_template"):
        load_config(None, ["model.chat_template=maybe"])


def test_prompts_render_with_the_chat_template(folder):
    tok = load_tokenizer(folder)
    ids = prompt_ids(tok, "37-85=")
    assert tok.convert_ids_to_tokens(ids) == [BOS, "[INST]", *"37-85=", "[/INST]"]
    messages = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    both = prompt_ids(tok, [*messages, {"role": "user", "content": "2+2="}])
    assert tok.decode(both) == "<s>[INST]1+1=[/INST]2</s>[INST]2+2=[/INST]"
    assert prompt_text(tok, messages[:1]) == "<s>[INST]1+1=[/INST]"
    assert tok.convert_ids_to_tokens(prompt_ids(tok, "37-85=", False)) == list("37-85=")


def test_built_in_tokenization_is_unchanged():
    """The built-in policy has no chat template and its tokenizer adds nothing: prompt ids as before."""
    from envs.base import make_env

    cfg = load_config("configs/smoke.yaml")
    tasks = make_env("arithmetic").tasks("train", cfg.task, 0)[:200]
    tok = build_tokenizer([t["prompt"] for t in tasks] + [t["answer"] for t in tasks], 64)
    for t in tasks:
        assert prompt_ids(tok, t["prompt"]) == tok(t["prompt"], add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="has none"):
        prompt_ids(tok, [{"role": "user", "content": "1+1="}])


def test_stop_ids_are_the_models_own(folder, tmp_path):
    tok = load_tokenizer(folder)
    assert stop_ids(folder, tok) == [tok.eos_token_id, tok.convert_tokens_to_ids(EOT)]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == stop_ids(folder, tok)
    single = _copy(folder, tmp_path / "one", drop=("generation_config.json",))
    assert stop_ids(single, tok) == [tok.eos_token_id]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_init_stores_the_folder_unchanged_and_warmup_zero_passes_it_on(folder, tmp_path):
    from rl_core.artifacts.stage import StageJob
    from rl_core.artifacts.store import Store
    from rl_core.run.context import RunContext
    from rl_core.training.sft import init_body, warmup_body

    (folder / ".cache").mkdir(exist_ok=True)  # a hub download's leftovers are not part of the model
    cfg = load_config(
        "configs/smoke.yaml",
        [f"model.path={folder}", "rollout.engine=hf", "warmup.steps=0", "model.max_position=48"],
    )
    store = Store(str(tmp_path / "store"))
    ctx = RunContext(cfg, "r", store=store)
    init = init_body(ctx, StageJob(0, {}, store.stage_uri(ctx.base_id, 0, "init")))
    ref = init.outputs["checkpoint"]
    want = {f.name: _sha(f) for f in folder.iterdir() if f.is_file()}
    assert ref.files == want and init.metrics["vocab_size"] == len(load_tokenizer(folder))
    warm = warmup_body(ctx, StageJob(0, {"checkpoint": ref}, store.stage_uri(ctx.base_id, 0, "warmup")))
    assert warm.outputs["checkpoint"] == ref

    # a warm-up that trains keeps every file of the folder but the weights
    ctx.cfg.warmup.steps, ctx.cfg.warmup.batch_size = 2, 4
    trained = warmup_body(ctx, StageJob(0, {"checkpoint": ref}, store.stage_uri(ctx.base_id, 0, "warm2")))
    files = trained.outputs["checkpoint"].files
    assert {k: v for k, v in files.items() if k != "model.safetensors"} == {
        k: v for k, v in want.items() if k != "model.safetensors"
    }
    assert files["model.safetensors"] != want["model.safetensors"]


def test_a_folder_behind_an_fsspec_url(folder, tmp_path):
    """A remote folder (fsspec's in-memory filesystem stands for S3 here: same calls) is checked without
    fetching its weights, then stored byte for byte; a changed folder is refused for a new run."""
    import fsspec

    from rl_core.artifacts.stage import run_stage
    from rl_core.artifacts.store import Store
    from rl_core.models.policy_folder import check_stored_base
    from rl_core.run.context import RunContext
    from rl_core.training.sft import init_body

    fs = fsspec.filesystem("memory")
    for f in folder.iterdir():
        if f.is_file():
            fs.pipe(f"/models/llama/{f.name}", f.read_bytes())
    url = "memory://models/llama"
    assert check_policy_folder(url, vllm=False)["architecture"] == "LlamaForCausalLM"
    _refused("memory://models/none", "no such folder")
    cfg = load_config("configs/smoke.yaml", [f"model.path={url}", "rollout.engine=hf"])
    store = Store(str(tmp_path / "store"))
    ctx = RunContext(cfg, "r", store=store)
    init = run_stage(store, ctx.base_id, 0, "init", ctx.base_hash, {}, lambda job: init_body(ctx, job))
    want = {f.name: _sha(f) for f in folder.iterdir() if f.is_file()}
    assert init.outputs["checkpoint"].files == want
    check_stored_base(url, store, ctx.base_id)  # unchanged: fine
    fs.pipe("/models/llama/generation_config.json", b'{"eos_token_id": 3}')
    with pytest.raises(ModelFolderError, match="the folder changed since the base model"):
        check_stored_base(url, store, ctx.base_id)
    fs.rm("/models/llama", recursive=True)


def test_hf_engine_stops_at_either_eos_id(folder):
    """The HF engine (the fallback) ends a completion at the first of the model's EOS ids, the second one
    (generation_config.json's <|eot|>) included."""
    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec

    engine = HFEngine(folder)
    tok = engine.tokenizer
    eos = set(stop_ids(folder, tok))
    reqs = [Request(prompt_ids(tok, f"{i}+{i}="), seed=i) for i in range(4)]
    comps = [c for cs in engine.generate(reqs, SamplingSpec(n=8, max_tokens=12)) for c in cs]
    ends = {c.token_ids[-1] for c in comps if c.finish_reason == "stop"}
    assert ends == eos  # both ids were sampled and each ended its completion
    for c in comps:
        assert not set(c.token_ids[:-1]) & eos
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in eos)


def test_a_tied_view_that_cannot_be_built_leaves_nothing_in_the_cache(tmp_path):
    """A tied folder whose weights hold no input embedding: refused, naming it, and no half-built view left
    in the machine's cache (it once was, and every later check of the cache saw it)."""
    import torch
    from safetensors.torch import save_file

    from rl_core.artifacts.paths import cache_dir
    from rl_core.models.engine_view import engine_folder

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    save_file({"model.norm.weight": torch.ones(4)}, str(bad / "model.safetensors"))
    before = set(cache_dir("engine-views").iterdir())
    with pytest.raises(ValueError, match="tied embeddings, but no model.embed_tokens.weight"):
        engine_folder(bad)
    assert set(cache_dir("engine-views").iterdir()) == before


def test_vision_language_folders_are_refused_before_work_when_they_cannot_run(tmp_path):
    """A family rlfoundry does not run (PaliGemma) is named; an Idefics3 folder without its processor names
    the missing files (the processor is the source of its ids and pixels)."""
    from transformers import PaliGemmaConfig

    from rl_core.models.policy_folder import _architecture
    from tests.model_folders import write_idefics3_folder

    pali = tmp_path / "paligemma"
    PaliGemmaConfig(architectures=["PaliGemmaForConditionalGeneration"]).save_pretrained(pali)
    with pytest.raises(ModelFolderError, match="vision-language model type 'paligemma' is not supported"):
        _architecture(str(pali), pali, vllm=False, max_model_len=32)
    folder = write_idefics3_folder(tmp_path / "idefics3")
    assert (
        _architecture(str(folder), folder, vllm=False, max_model_len=32)[0]
        == "Idefics3ForConditionalGeneration"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in folder.iterdir():
        if f.name != "processor_config.json":
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(
        ModelFolderError, match=r"bare: a vision-language folder needs its processor: no processor_config"
    ):
        _architecture(str(bare), bare, vllm=False, max_model_len=32)
