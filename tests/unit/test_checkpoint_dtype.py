"""A folder's dtype kept: a bf16 checkpoint trains in float32 (the trainer's master weights), is stored bf16
(config and safetensors), and resumes from the float32 masters kept in the optimizer artifact — not from the
rounded checkpoint — so a resumed run is the uninterrupted one bit for bit. No process is started: the torch
train engine on a tiny Llama folder the test writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_core.artifacts.safe_state import dumps, loads
from rl_core.models.model import (
    folder_dtype,
    load_model,
    save_with_weights,
    stored_weights,
)
from rl_core.training.train import MASTERS, _load_masters, optimizer_file, read_optimizer_file
from rl_core.training.train_engine import make_train_engine
from tests.model_folders import write_llama_folder


def _config(folder: Path, **change: object) -> None:
    data = json.loads((folder / "config.json").read_text())
    data.update(change)
    (folder / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        ({"dtype": "bfloat16"}, "bfloat16"),
        ({"torch_dtype": "float16"}, "float16"),  # before transformers 4.56
        ({"torch_dtype": "torch.bfloat16"}, "bfloat16"),
        ({"text_config": {"dtype": "bfloat16"}}, "bfloat16"),  # a vision-language model's
        ({}, "float32"),
    ],
)
def test_the_folder_says_its_dtype(tmp_path: Path, keys: dict, want: str):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **keys}))
    assert folder_dtype(tmp_path) == want


def test_a_dtype_not_trained_from_is_refused_naming_the_file(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "int8"}))
    with pytest.raises(ValueError, match=r"config\.json: dtype 'int8'"):
        folder_dtype(tmp_path)


def test_stored_weights_round_floats_and_keep_the_rest():
    w = {"a": torch.tensor([1.0 + 2**-10, 3.0]), "pos": torch.tensor([1, 2])}
    assert stored_weights(w, "float32") is w
    got = stored_weights(w, "bfloat16")
    assert got["a"].dtype == torch.bfloat16 and got["pos"].dtype == torch.int64
    assert got["a"][0].item() == 1.0  # 1 + 2^-10 has no bf16 (8-bit mantissa) spelling: rounded


def _step(engine, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, 40, (4, 12), generator=g)
    loss = engine.module(input_ids=ids, labels=ids).loss
    engine.backward_step(loss)


class _Cfg:  # what TorchTrainEngine reads of train.*
    lr, weight_decay, grad_clip = 1e-2, 0.0, 1.0


def test_bf16_in_bf16_out_and_resume_from_the_masters_is_exact(tmp_path: Path):
    src = write_llama_folder(tmp_path / "bf16", tie=True, dtype="bfloat16")
    model = load_model(src)
    assert next(model.parameters()).dtype == torch.float32  # the trainer computes in float32
    engine = make_train_engine("torch", model, _Cfg())
    _step(engine, 0)
    masters = engine.weights()
    out = save_with_weights(src, stored_weights(masters, folder_dtype(src)), tmp_path / "ckpt")
    state = optimizer_file(engine.optimizer_state(), masters)
    _step(engine, 1)
    want = engine.weights()  # the uninterrupted run after its next step

    # bf16 out: the config and every stored tensor; the tie kept (one tensor after a transformers reload)
    assert folder_dtype(out) == "bfloat16"
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (a safetensors handle, not a dict)
        assert {f.get_tensor(k).dtype for k in names} == {torch.bfloat16}
        assert "lm_head.weight" not in names
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(str(out))
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()

    def resumed(with_masters: bool) -> dict:
        model = load_model(out)
        tree, kept = read_optimizer_file(state, "optimizer.safetensors")
        assert kept is not None and all(v.dtype == torch.float32 for v in kept.values())
        if with_masters:
            _load_masters(model, kept, "optimizer.safetensors")
        eng = make_train_engine("torch", model, _Cfg())
        eng.load_optimizer_tree(tree)
        _step(eng, 1)
        return eng.weights()

    got = resumed(True)
    assert all(torch.equal(got[k], want[k]) for k in want)  # bit for bit the uninterrupted run
    # The control: from the rounded checkpoint alone the run goes elsewhere.
    off = resumed(False)
    assert max(float((off[k] - want[k]).abs().max()) for k in want) > 1e-4


def test_a_float32_checkpoint_keeps_the_state_file_as_it_was():
    data = dumps({"format": "x", "t": torch.zeros(2)})
    assert optimizer_file(data, None) is data
    tree, kept = read_optimizer_file(data, "u")
    assert kept is None and tree["format"] == "x"


def test_master_weights_that_do_not_fit_are_refused(tmp_path: Path):
    src = write_llama_folder(tmp_path / "m", dtype="bfloat16")
    model = load_model(src)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="not all float32"):
        _load_masters(model, {k: v.to(torch.bfloat16) for k, v in good.items()}, "opt")
    with pytest.raises(ValueError, match="unexpected"):
        _load_masters(model, {**good, "extra.weight": torch.zeros(1)}, "opt")
    with pytest.raises(ValueError, match="missing"):
        _load_masters(model, {k: v for k, v in good.items() if "layers.0" not in k}, "opt")
    planted = dumps({"state": {}, MASTERS: {}, "run": "code"})
    with pytest.raises(ValueError, match="unexpected keys"):
        read_optimizer_file(planted, "opt")
    assert loads(optimizer_file(dumps({"s": 1}), {}), "x")["state"] == {"s": 1}
