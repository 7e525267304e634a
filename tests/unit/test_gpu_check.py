"""benchmarks/gpu_check.py's own arithmetic and decisions, without a GPU: the FLOPs its MFU divides, the
tokenizer that covers the vocabulary, the placement it asks for on the GPU it is meant for, and the clear
stop where no GPU is."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from rl_core.models.machine import Machine
from rl_core.models.placement import PlacementError, plan


def test_matmul_params_are_what_the_model_multiplies_by() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(**gpu_check.SMOKE_SHAPE))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    # the tied head shares the embedding: counted once, as the head's matmul
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert gpu_check.matmul_params(gpu_check.SMOKE_SHAPE) == linear
    # Qwen2.5-0.5B: 494.0M parameters, of which biases and norms are the 0.07M left out here
    assert gpu_check.matmul_params(gpu_check.QWEN25_05B) == 493_961_216


def test_train_flops_count_four_forwards_with_causal_attention() -> None:
    shape = gpu_check.SMOKE_SHAPE
    n, layers, h = gpu_check.matmul_params(shape), shape["num_hidden_layers"], shape["hidden_size"]
    one = gpu_check.train_flops(shape, [10])
    assert one == 4 * (2 * n * 10 + 2 * layers * h * 100)
    # quadratic in length through attention only: two sequences of 10 cost less than one of 20
    assert gpu_check.train_flops(shape, [10, 10]) == 2 * one < gpu_check.train_flops(shape, [20])


def test_the_tokenizer_covers_every_id_the_model_can_sample() -> None:
    tok = gpu_check.word_tokenizer(600)
    assert len(tok) == 600
    assert tok.convert_tokens_to_ids(gpu_check.EOS) == 0 and tok.pad_token_id == 1
    assert tok.decode([5, 599]) == "w5 w599"


def test_its_config_is_planned_in_bf16_and_fits_an_h200(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(gpu_check.QWEN25_05B))
    args = argparse.Namespace(max_tokens=256, n=4, dtype="bf16", micro_batch_size=32, prompt_tokens=[64, 192])
    cfg = gpu_check.config(tmp_path, args)
    placed = plan(cfg, Machine.described("H200", flash_attn=False))
    assert placed.workloads["trainer"].device == "cuda:0"
    assert placed.workloads["trainer"].dtype == placed.workloads["hf_engine"].dtype == "bfloat16"
    assert placed.workloads["trainer"].attn == "sdpa"  # no flash-attn on the GPU machine's image
    assert placed.memory["tokens_per_micro_batch"] == 32 * 448
    gpu = placed.memory["gpus"]["0"]
    assert max(gpu["train_phase_gib"], gpu["generate_phase_gib"]) < gpu["total_gib"]
    # the same check in bf16 on a GPU without bf16 is refused before any work
    with pytest.raises(PlacementError, match="bf16"):
        plan(cfg, Machine.described("V100"))


def test_without_a_gpu_it_stops_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Machine, "this", classmethod(lambda cls: Machine()))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--json"])
    with pytest.raises(SystemExit, match="no CUDA GPU.*--smoke"):
        gpu_check.main()


def test_the_large_size_is_planned_on_an_h200_and_refused_before_any_work_where_it_cannot_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rl_core.models.machine import GPU

    (tmp_path / "config.json").write_text(json.dumps(gpu_check.QWEN25_05B))
    large = argparse.Namespace(**{"dtype": "bf16", "pack_tokens": 4096, **gpu_check.LARGE})
    assert large.prompts * large.n >= 1000  # the large size: >= 1,000 sequences
    h200 = Machine.described("H200", flash_attn=False)
    placed = gpu_check.refuse_unplanned(gpu_check.config(tmp_path, large), h200, large, gpu_check.QWEN25_05B)
    assert placed.memory["tokens_per_micro_batch"] == 64 * (448 + 256)
    # a 12 GiB GPU: the HF engine's KV cache for 1,024 sequences of 704 tokens alone is 8.2 GiB
    small = Machine((GPU("Small 12GB", 12.0, (9, 0), 100.0),), cpu_bf16=True)
    with pytest.raises(SystemExit, match=r"refused before any work: .*(memory plan|generation plan)"):
        gpu_check.refuse_unplanned(gpu_check.config(tmp_path, large), small, large, gpu_check.QWEN25_05B)
    # through the command line: refused before the folder is written (no work at all)
    monkeypatch.setattr(Machine, "this", classmethod(lambda cls: small))
    monkeypatch.setattr(gpu_check, "write_folder", lambda *a, **k: pytest.fail("work began"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--large", "--out", str(tmp_path / "r" / "x.json")])
    with pytest.raises(SystemExit, match="256x4 sequences of up to 448\\+256 tokens refused before any work"):
        gpu_check.main()
    assert not (tmp_path / "r").exists()


def test_the_default_sizes_figures_are_on_disk_before_the_large_size_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run stopped while it measures the large size (infra/gpu_check.sh's timeout, a lent machine's
    budget) leaves the default size's figures in the result file, the large size marked unfinished."""
    sizes: list[int] = []

    def measure(shape, args, machine, arms):
        sizes.append(args.prompts)
        if len(sizes) == 2:  # the large size: the run is stopped here
            raise KeyboardInterrupt
        return {"packed_over_padded": 1.5, "vs_bare": {"generate": 1.1}}

    monkeypatch.setattr(gpu_check, "measure", measure)
    out = tmp_path / "r" / "gpu_check.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--smoke", "--large", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main()
    assert sizes == [4, gpu_check.LARGE["prompts"]]
    kept = json.loads(out.read_text())
    assert kept["vs_bare"] == {"generate": 1.1} and kept["ratio"] == 1.5
    assert kept["large"] == {"status": "not finished"}
