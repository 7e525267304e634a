"""The GPU check: rlfoundry's train stage (DeepSpeed) and HF engine on one CUDA GPU in bf16, on the shape of
Qwen2.5-0.5B, padded and packed; what ``infra/gpu_check.sh`` runs on a lent GPU machine (no network, no
vLLM there: its wheel is too large to carry).

    bash infra/gpu_check.sh                # on the GPU machine, with the wheels of make gpu-wheels
    .venv/bin/python benchmarks/gpu_check.py --json          # the same where a GPU and the project are
    .venv/bin/python benchmarks/gpu_check.py --smoke --json  # on a CPU: tiny shape, fp32, figures meaningless

What it does, through the code a run uses (rl_core.models.placement decides device, dtype and attention
kernel): 1. writes a Hugging Face folder with Qwen2.5-0.5B's exact config (vocab 151,936, 24 layers, hidden
896, 14
   query and 2 key/value heads, tied embeddings, bf16 safetensors; random weights and a word-level tokenizer
   covering the whole vocabulary: no hub here);
2. plans the placement of ``train.dtype=bf16`` ZeRO-1 with that folder as ``model.path`` on this machine and
   records it (the memory plan included);
3. generates ``--prompts`` x ``--n`` completions of ``--max-tokens`` tokens with the HF engine (the policy's
   dtype, its attention kernel) and times them;
4. truncates each completion at a seeded length (random weights almost never sample EOS: this stands in for
   the length mix of a real policy), then runs PPO updates (``ppo_update`` with a recomputed anchor, one
   epoch) on the DeepSpeed engine, once padded and once packed (``train.packing``), each arm loading the
   policy afresh: the first update of each arm measures the trainer/engine logprob mismatch over every
   completion token, the next ``--repeats`` are timed.

Reported: generation tokens/s (new tokens) and train tokens/s (real prompt + completion tokens per second of
update), peak GPU memory per phase (allocated and reserved), the mismatch (mean and max |engine - trainer|
logprob per token), and the model FLOP utilisation of the train updates against the GPU's dense bf16 peak
(``rl_core.models.machine.KNOWN_GPUS``): four forwards per update (the anchor's recompute, the update's
forward and its backward as two), a forward of t tokens 2·N·t (N the matmul parameters, the tied head once)
plus causal attention's 2·layers·hidden·t². ``ratio`` = packed / padded train tokens/s (higher: packing pays
more)."""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
# Qwen2.5-0.5B's config.json, as the hub has it (the fields that shape compute and memory).
QWEN25_05B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
}
SMOKE_SHAPE: dict[str, Any] = {
    **QWEN25_05B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
}
EOS, PAD = "<|im_end|>", "<|endoftext|>"


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer whose vocabulary is exactly ``vocab_size`` tokens (EOS and PAD first), so that
    every id the model can sample decodes: Qwen's own tokenizer cannot be fetched here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0, PAD: 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS, pad_token=PAD, unk_token="<unk>")


def write_folder(out: Path, shape: dict[str, Any], seed: int = 0) -> Path:
    """save_pretrained a random Qwen2ForCausalLM of ``shape`` in bf16 (a hub folder's dtype), tied."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = word_tokenizer(shape["vocab_size"])
    config = Qwen2Config(**shape, eos_token_id=0, pad_token_id=1, bos_token_id=0, dtype="bfloat16")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def matmul_params(shape: dict[str, Any]) -> int:
    """Parameters a token's forward multiplies by (the tied head once, the embedding lookup not)."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    return layers * (2 * h * h + 2 * h * kv + 3 * h * inter) + shape["vocab_size"] * h


def train_flops(shape: dict[str, Any], lengths: list[int]) -> float:
    """Model FLOPs of one update over sequences of ``lengths`` (module docstring)."""
    n, layers, h = matmul_params(shape), shape["num_hidden_layers"], shape["hidden_size"]
    # A forward of t tokens: 2·N·t, and QKᵀ and AV over a causal context of t/2 on average: 2·layers·h·t².
    # The update's forward and backward are 3 forwards, the anchor's recompute one more.
    return float(sum(4 * (2 * n * t + 2 * layers * h * t * t) for t in lengths))


class Meter:
    """Wall seconds and peak GPU memory of a phase (synchronised; memory only on a GPU)."""

    def __init__(self, device: str):
        import torch

        self.cuda = device.startswith("cuda")
        self.torch = torch

    def __enter__(self) -> Meter:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0

    def peak(self) -> dict[str, float] | None:
        if not self.cuda:
            return None
        cuda = self.torch.cuda
        return {
            "allocated_gib": round(cuda.max_memory_allocated() / (1 << 30), 2),
            "reserved_gib": round(cuda.max_memory_reserved() / (1 << 30), 2),
        }


def generate(folder: Path, placement: Any, args: argparse.Namespace, vocab: int) -> tuple[Any, dict]:
    """The HF engine's completions of seeded random prompts, timed after a one-request warm-up."""
    import numpy as np

    from rl_core.generation.rollout import HFEngine, Request, SamplingSpec

    wl = placement.workloads["hf_engine"]
    engine = HFEngine(folder, dtype=wl.dtype, workload=wl)
    rng = np.random.default_rng(1)
    lo, hi = args.prompt_tokens
    requests = [
        Request([int(x) for x in rng.integers(3, vocab, int(rng.integers(lo, hi + 1)))], seed=100 + i)
        for i in range(args.prompts)
    ]
    spec = SamplingSpec(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    engine.generate(requests[:1], SamplingSpec(n=1, max_tokens=4))
    with Meter(wl.device) as m:
        out = engine.generate(requests, spec)
    new = sum(len(c.token_ids) for cs in out for c in cs)
    report = {
        "engine": "hf",
        "device": wl.device,
        "dtype": wl.dtype,
        "attn": wl.attn,
        "sequences": args.prompts * args.n,
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "new_tokens": new,
        "seconds": round(m.seconds, 3),
        "tokens_per_s": round(new / m.seconds, 1),
        "peak_memory": m.peak(),
    }
    del engine
    return (requests, out), report


def rollouts(requests: list[Any], out: list[list[Any]], args: argparse.Namespace) -> Any:
    """The rollout table of the completions, each cut at a seeded length in [max_tokens/8, max_tokens]."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(2)
    rows = []
    for r, cs in zip(requests, out, strict=True):
        for c in cs:
            keep = int(rng.integers(max(1, args.max_tokens // 8), len(c.token_ids) + 1))
            rows.append(
                {
                    "prompt_ids": list(r.prompt_ids),
                    "completion_ids": c.token_ids[:keep],
                    "logprobs": c.logprobs[:keep],
                    "loss_mask": [1] * keep,
                    "advantage": float(rng.normal()),
                }
            )
    return pd.DataFrame(rows)


def train_arm(
    folder: Path, cfg: Any, placement: Any, df: Any, pack: int | None, shape: dict[str, Any], repeats: int
) -> dict[str, Any]:
    """One arm: the policy loaded as the train stage loads it, its DeepSpeed engine, one update measuring the
    mismatch, ``repeats`` timed updates."""
    import torch

    from benchmarks.packing import forward_padding
    from rl_core.models.model import load_model
    from rl_core.training.ppo import make_batch, ppo_update
    from rl_core.training.train_engine import make_train_engine

    wl = placement.workloads["trainer"]
    train = cfg.train.model_copy(update={"packing": pack is not None, "pack_tokens": pack or 0})
    model = load_model(folder, wl)
    engine = make_train_engine("deepspeed", model, train, wl.device)
    batch = make_batch(df, pad_id=1, max_tokens=cfg.rollout.max_tokens, seed=3, pack_tokens=pack)
    lengths = [int(n) for n in batch.attention_mask.sum(1)]
    with Meter(wl.device) as first:
        metrics = ppo_update(engine, batch, train)
    clock = []
    for _ in range(repeats):
        with Meter(wl.device) as m:
            ppo_update(engine, batch, train)
        clock.append(m.seconds)
    best = min(clock)
    flops = train_flops(shape, lengths)
    gpu = torch.cuda.get_device_name(wl.device) if wl.device.startswith("cuda") else ""
    from rl_core.models.machine import peak_tflops

    peak = peak_tflops(gpu) if gpu else 0.0
    result = {
        "packing": pack is not None,
        "pack_tokens": pack,
        "device": wl.device,
        "dtype": wl.dtype,
        "attn": wl.attn,
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "optimizer_steps": metrics["optimizer_steps"],
        "first_update_s": round(first.seconds, 3),
        "update_s": [round(c, 4) for c in clock],
        "tokens_per_s": round(sum(lengths) / best, 1),
        "padding_fraction": round(forward_padding(batch, train.micro_batch_size, batch.pack_tokens), 4),
        "peak_memory": first.peak(),
        "model_tflops_per_update": round(flops / 1e12, 3),
        "achieved_tflops": round(flops / best / 1e12, 2),
        "mfu": round(flops / best / (peak * 1e12), 4) if peak else None,
        "logprob_mismatch_mean": metrics["logprob_mismatch_mean"],
        "logprob_mismatch_max": metrics["logprob_mismatch_max"],
        "grad_norm": metrics["grad_norm"],
    }
    engine.close()
    del engine, model
    gc.collect()
    if wl.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def config(folder: Path, args: argparse.Namespace) -> Any:
    from rl_core.schema.config import config_from_dict

    return config_from_dict(
        {
            # the longest sequence the check makes: what the memory plan sizes activations and logits by
            "model": {"path": str(folder), "max_position": args.prompt_tokens[1] + args.max_tokens},
            "rollout": {"engine": "hf", "max_tokens": args.max_tokens, "n": args.n},
            "train": {
                "backend": "deepspeed",
                "dtype": args.dtype,
                "zero_stage": 1,
                "micro_batch_size": args.micro_batch_size,
                "old_logprobs": "recompute",
                "epochs": 1,
            },
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4, help="completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[64, 192], metavar=("MIN", "MAX"))
    ap.add_argument("--max-tokens", type=int, default=256, help="new tokens per completion")
    ap.add_argument("--micro-batch-size", type=int, default=32, help="sequences per optimizer step")
    ap.add_argument("--pack-tokens", type=int, default=4096, help="the packed arm's tokens per row")
    ap.add_argument("--repeats", type=int, default=3, help="timed updates per train arm (the fastest counts)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="train.dtype (default bf16)")
    ap.add_argument(
        "--shape",
        choices=["qwen2.5-0.5b", "smoke"],
        help="the policy shape (default qwen2.5-0.5b; smoke with --smoke, whose batch stays tiny anyway)",
    )
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    ap.add_argument(
        "--on-cpu",
        action="store_true",
        help="run the check on the CPU where there is no GPU (slow: pass smaller sizes); its figures are the "
        "CPU kernels' (the bf16 mismatch of benchmarks/results/gpu_check_cpu_bf16.json)",
    )
    add_smoke_flag(ap)
    args = ap.parse_args()
    shape = (
        QWEN25_05B if (args.shape or ("smoke" if args.smoke else "qwen2.5-0.5b")) != "smoke" else SMOKE_SHAPE
    )
    if args.smoke:
        args.prompts, args.n, args.prompt_tokens, args.max_tokens = 4, 2, [8, 16], 8
        args.micro_batch_size, args.repeats, args.pack_tokens = 4, 1, 48
    args.dtype = args.dtype or ("fp32" if args.smoke else "bf16")

    from rl_core.models.machine import Machine
    from rl_core.models.placement import plan

    machine = Machine.this()
    if not machine.gpus and not (args.smoke or args.on_cpu):
        sys.exit(
            "gpu_check: torch sees no CUDA GPU (torch.cuda.is_available() is False); --smoke runs on a CPU"
        )
    with tempfile.TemporaryDirectory(prefix="rlf-gpu-check-") as tmp:
        t0 = time.perf_counter()
        folder = write_folder(Path(tmp) / "qwen2.5-0.5b-shape", shape)
        written = time.perf_counter() - t0
        cfg = config(folder, args)
        placement = plan(cfg, machine)
        (requests, out), gen = generate(folder, placement, args, shape["vocab_size"])
        df = rollouts(requests, out, args)
        arms = [
            train_arm(folder, cfg, placement, df, p, shape, args.repeats) for p in (None, args.pack_tokens)
        ]
    padded, packed = arms
    result = {
        "benchmark": "gpu_check",
        "shape": "smoke" if shape is SMOKE_SHAPE else "Qwen2.5-0.5B",
        "model_config": shape,
        "matmul_params": matmul_params(shape),
        "folder_write_s": round(written, 1),
        "placement": placement.as_dict(),
        "generate": gen,
        "train": arms,
        "logprob_mismatch_mean": max(a["logprob_mismatch_mean"] for a in arms),
        "logprob_mismatch_max": max(a["logprob_mismatch_max"] for a in arms),
        "mfu": packed["mfu"],
        "ratio": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
