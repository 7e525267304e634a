"""A user's own model folder (``model.path``) that would be trained wrongly or crash mid-run is refused before
any work, naming the folder, the file and what is wrong; one that is merely laid out the way other
transformers versions save is read as transformers reads it. The folders are written here (no hub):
a classifier head instead of an LM head, an untied model without its head, a truncated shard, a Llama-3.1
Instruct layout without generation_config.json, a tokenizer without EOS, a stale pytorch_model.bin, a folder
without a chat template for a dataset of chat messages, a chat template kept in chat_template.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from rl_core.models.model import (
    is_weight_file,
    load_model,
    load_tokenizer,
    pad_id,
    prompt_ids,
    save_with_weights,
    stop_ids,
)
from rl_core.models.policy_folder import ModelFolderError, check_policy_folder
from rl_core.schema.config import ConfigError
from tests.model_folders import CHAT_TEMPLATE, EOS, EOT, write_llama_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_llama_folder(tmp_path_factory.mktemp("own") / "llama")


def _edit_json(path: Path, edit: Any) -> None:
    """Rewrite the JSON file ``path`` with ``edit`` applied to its data (in place)."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _refused(path: Path, match: str, **kw) -> str:
    with pytest.raises(ModelFolderError, match=match) as e:
        check_policy_folder(str(path), **{"vllm": False, **kw})
    assert f"model.path {path}" in str(e.value)
    return str(e.value)


def _sharded(folder: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    out = _copy(folder, out)
    (out / "model.safetensors").unlink()
    AutoModelForCausalLM.from_pretrained(str(folder)).save_pretrained(out, max_shard_size="20KB")
    return out


# 1: what is trained must be the causal LM the folder holds, every weight of it


def test_a_classifier_folder_is_refused_not_trained_with_a_random_lm_head(folder, tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    out = _copy(folder, tmp_path / "seqcls")
    (out / "model.safetensors").unlink()
    cfg = LlamaConfig.from_pretrained(out)
    cfg.num_labels = 1
    LlamaForSequenceClassification(cfg).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "LlamaForSequenceClassification"
    ]
    msg = _refused(out, "architecture LlamaForSequenceClassification is not a causal language model")
    assert "config.json" in msg
    with pytest.raises(ModelFolderError, match=r"lack 1 tensor\(s\) LlamaForCausalLM needs.*lm_head.weight"):
        load_model(out)  # loaded anyway (an old base checkpoint): refused, not given a random head


def test_an_untied_folder_without_its_lm_head_is_refused(folder, tmp_path):
    out = _copy(folder, tmp_path / "nohead")
    weights = load_file(str(out / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    _refused(out, r"untied embeddings \(tie_word_embeddings=false\) but the weights hold no lm_head.weight")
    with pytest.raises(ModelFolderError, match=rf"^{out}: its weights lack 1 tensor.*\['lm_head.weight'\]"):
        load_model(out)


def test_a_sharded_untied_folder_without_its_lm_head_is_refused(folder, tmp_path):
    out = _sharded(folder, tmp_path / "s")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard = index["weight_map"].pop("lm_head.weight")
    kept = {k: v for k, v in load_file(str(out / shard)).items() if k != "lm_head.weight"}
    if kept:
        save_file(kept, str(out / shard), metadata={"format": "pt"})
    else:
        (out / shard).unlink()
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(out, "weights hold no lm_head.weight")


def test_a_head_of_another_name_is_found_in_the_weights(tmp_path):
    """BioGPT's output embedding is ``output_projection``: an untied BioGPT folder passes with it, and is
    refused without it (not for a missing ``lm_head``)."""
    from tests.model_folders import write_biogpt_folder

    out = write_biogpt_folder(tmp_path / "biogpt")
    assert check_policy_folder(str(out), vllm=False)["architecture"] == "BioGptForCausalLM"
    weights = load_file(str(out / "model.safetensors"))
    del weights["output_projection.weight"]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    _refused(out, "the weights hold no output_projection.weight")


def test_tied_and_good_folders_still_load_with_every_weight(folder, tmp_path):
    import torch

    tied = write_llama_folder(tmp_path / "tied", tie=True)
    assert check_policy_folder(str(tied), vllm=False)["architecture"] == "LlamaForCausalLM"
    model = load_model(tied)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    stored = load_file(str(folder / "model.safetensors"))
    loaded = load_model(folder).state_dict()
    assert torch.equal(loaded["lm_head.weight"], stored["lm_head.weight"])


def test_load_model_refuses_a_folder_missing_any_weight(folder, tmp_path):
    out = _copy(folder, tmp_path / "nolayer")
    weights = load_file(str(out / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match=rf"{out}: .*model.layers.1.mlp.up_proj.weight"):
        load_model(out)


# 2: a truncated shard is refused at the folder check, naming it and both sizes


def test_a_truncated_shard_is_refused_naming_it_and_both_sizes(folder, tmp_path):
    out = _sharded(folder, tmp_path / "trunc")
    shard = sorted(out.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    msg = _refused(
        out, rf"{shard.name} is {len(data) // 2} bytes but its header says its tensors end at byte"
    )
    assert f"byte {len(data)}:" in msg and "truncated" in msg


def test_a_truncated_or_padded_single_file_is_refused(folder, tmp_path):
    out = _copy(folder, tmp_path / "whole")
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[:-1])
    _refused(out, rf"model.safetensors is {len(data) - 1} bytes .* end at byte {len(data)}: .*truncated")
    (out / "model.safetensors").write_bytes(data + b"\0" * 16)
    _refused(out, rf"model.safetensors is {len(data) + 16} bytes .* end at byte {len(data)}: .*longer")


# 3: without generation_config.json, config.json's EOS ids stop generation (as transformers' generate does)


def _llama31_layout(folder: Path, out: Path) -> tuple[Path, list[int]]:
    """``folder`` as a Llama-3.1 Instruct folder without generation_config.json: config.json names the EOS
    ids as a list, the tokenizer's EOS is the turn end (``<|eot|>``)."""
    out = _copy(folder, out)
    (out / "generation_config.json").unlink()
    tok = load_tokenizer(out)
    eos, eot = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(EOT)
    _edit_json(out / "config.json", lambda d: d.update(eos_token_id=[eos, eot]))
    _edit_json(out / "tokenizer_config.json", lambda d: d.update(eos_token=EOT))
    return out, [eos, eot]


def test_stop_ids_fall_back_to_config_json_without_a_generation_config(folder, tmp_path):
    out, (eos, eot) = _llama31_layout(folder, tmp_path / "l31")
    tok = load_tokenizer(out)
    assert tok.eos_token_id == eot
    assert stop_ids(out, tok) == [eos, eot]  # config.json's, in its order, then the tokenizer's (a repeat)


def test_a_vlm_config_names_its_eos_in_the_text_config(folder, tmp_path):
    out, (eos, eot) = _llama31_layout(folder, tmp_path / "vl")
    _edit_json(out / "config.json", lambda d: d.update(text_config={"eos_token_id": d.pop("eos_token_id")}))
    assert stop_ids(out, load_tokenizer(out)) == [eos, eot]


def test_a_generation_config_keeps_its_priority_over_config_json(folder, tmp_path):
    out, (eos, eot) = _llama31_layout(folder, tmp_path / "gen")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert stop_ids(out, load_tokenizer(out)) == [eos, eot]  # generation_config's, then the tokenizer's
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert stop_ids(out, load_tokenizer(out)) == [0, eot]  # config.json's list is not read


# 4: a tokenizer without an EOS token pads and ends its warm-up answers with the folder's first EOS id


def _no_eos_tokenizer(folder: Path, out: Path) -> Path:
    out = _copy(folder, out)
    _edit_json(out / "tokenizer_config.json", lambda d: [d.pop(k, None) for k in ("eos_token", "pad_token")])
    return out


def test_a_tokenizer_without_eos_or_pad_takes_the_generation_configs_first_eos(folder, tmp_path):
    from rl_core.training.sft import _sft_batch

    out = _no_eos_tokenizer(folder, tmp_path / "noeos")
    gen_eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    check_policy_folder(str(out), vllm=False)
    tok = load_tokenizer(out)
    assert tok.pad_token_id is None and tok.eos_token_id == gen_eos[0]
    assert stop_ids(out, tok) == gen_eos and pad_id(tok) == gen_eos[0]
    tasks = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "10+10=", "answer": "20"}]
    ids, attn, labels = _sft_batch(tok, None, tasks, [False, False], None, "auto")
    ends = [row[attn[i] == 1][-1].item() for i, row in enumerate(labels)]
    assert ends == [gen_eos[0]] * 2  # each answer closed by the EOS generation stops at
    assert ids[0, -1].item() == gen_eos[0] and attn[0, -1].item() == 0  # the shorter row padded with it


def test_a_folder_with_no_eos_anywhere_is_refused(folder, tmp_path):
    out = _no_eos_tokenizer(folder, tmp_path / "none")
    (out / "generation_config.json").unlink()
    _edit_json(out / "config.json", lambda d: d.pop("eos_token_id", None))
    _refused(out, "no EOS token")
    with pytest.raises(ValueError, match="no pad token and no EOS token"):
        pad_id(load_tokenizer(out))


# 5: a stale pytorch_model.bin is never copied into a checkpoint


def test_stale_weights_of_other_formats_are_not_copied_into_checkpoints(folder, tmp_path):
    import torch

    src = _copy(folder, tmp_path / "both")
    stale = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin", "m.pt"]
    for name in stale:
        (src / name).write_bytes(b"untrained")
    assert all(is_weight_file(n) for n in stale)
    assert not any(is_weight_file(n) for n in ("config.json", "tokenizer.json", "chat_template.jinja"))
    weights = load_file(str(folder / "model.safetensors"))
    ckpt = save_with_weights(src, {k: torch.zeros_like(v) for k, v in weights.items()}, tmp_path / "ckpt")
    names = {f.name for f in ckpt.iterdir()}
    assert not names & set(stale)
    assert {"config.json", "tokenizer.json", "generation_config.json", "model.safetensors"} <= names


# 6: a prompt the folder cannot render is refused at the preflight, naming the path and the row


def _ctx(folder: Path, chat_template, prompts: list) -> SimpleNamespace:
    cfg = SimpleNamespace(
        model=SimpleNamespace(path=str(folder), chat_template=chat_template),
        task=SimpleNamespace(env="dataset"),
    )
    env = SimpleNamespace(reset=lambda task, seed: task["prompt"])
    tasks = [{"prompt": p} for p in prompts]
    return SimpleNamespace(cfg=cfg, env=env, multimodal=None, train_tasks=tasks[:1], heldout_tasks=tasks[1:])


def test_a_chat_prompt_without_a_chat_template_is_refused_naming_path_and_row(tmp_path):
    from rl_core.run.preflight import longest_prompt

    plain = write_llama_folder(tmp_path / "plain", chat_template=None)
    user = [{"role": "user", "content": "1+1="}]
    with pytest.raises(ConfigError) as e:
        longest_prompt(_ctx(plain, "auto", [user, user]), plain)
    msg = str(e.value)
    assert msg.startswith(
        f"model.path {plain}: the prompt of task.env=dataset train row 0 cannot be rendered"
    )
    assert "ValueError: the prompt needs a chat template and the tokenizer has none" in msg


def test_a_template_that_raises_on_a_system_turn_is_refused_naming_the_row(folder):
    from rl_core.run.preflight import longest_prompt

    user = [{"role": "user", "content": "1+1="}]
    system = [{"role": "system", "content": "be brief"}, *user]
    with pytest.raises(
        ConfigError, match=r"heldout row 1 cannot be rendered .*only user and assistant roles"
    ):
        longest_prompt(_ctx(folder, "auto", [user, user, system]), folder)
    assert longest_prompt(_ctx(folder, "auto", [user, user]), folder)[1] == "train row 0"


def test_the_run_stops_with_one_line_for_an_unrenderable_dataset(tmp_path):
    from flows.cli import app
    from tests.conftest import cli_env

    plain = write_llama_folder(tmp_path / "plain", chat_template=None)
    files = {}
    for name, numbers in (("train", range(8)), ("heldout", range(8, 12))):
        rows = [
            {"messages": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in numbers
        ]
        files[name] = str(tmp_path / f"{name}.jsonl")
        Path(files[name]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    env_args = {**files, "prompt_field": "messages", "verifier": "numeric"}
    sets = [f"model.path={plain}", "task.env=dataset", f"task.env_args={json.dumps(env_args)}"]
    sets += ["rollout.engine=hf"]
    args = ["run", "configs/smoke.yaml", *[x for s in sets for x in ("--set", s)], "--run-id", "notpl"]
    res = CliRunner().invoke(app, args, env=cli_env(tmp_path / "state"))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"model.path {plain}" in lines[0] and "train row 0" in lines[0], lines


# 7: a chat template kept only in chat_template.json (the processor's file before transformers 4.47) is read


def test_a_chat_template_in_chat_template_json_is_used(folder, tmp_path):
    out = _copy(folder, tmp_path / "tjson")
    (out / "chat_template.jinja").unlink()
    _edit_json(out / "tokenizer_config.json", lambda d: d.pop("chat_template", None))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    tok = load_tokenizer(out)
    assert tok.chat_template == CHAT_TEMPLATE
    assert prompt_ids(tok, "1+1=") == prompt_ids(load_tokenizer(folder), "1+1=")
    check_policy_folder(str(out), vllm=False, chat_template=True)
