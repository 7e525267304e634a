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
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, result_file  # noqa: E402
from benchmarks.gpu_bare import Meter, bare_generate, bare_update  # noqa: E402

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
EOS, PAD = "<|im_end|>", "<|endoftext|>"  # ids 0 and 1


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


def check_requests(vocab: int, prompts: int, lo: int, hi: int) -> list[Any]:
    """``prompts`` seeded random prompts of ``lo``..``hi`` tokens (ids past EOS and PAD), seeds from 100."""
    import numpy as np

    from rl_core.generation.rollout import Request

    rng = np.random.default_rng(1)
    return [
        Request([int(x) for x in rng.integers(3, vocab, int(rng.integers(lo, hi + 1)))], seed=100 + i)
        for i in range(prompts)
    ]


def generate(folder: Path, placement: Any, args: argparse.Namespace, vocab: int) -> tuple[Any, dict]:
    """The HF engine's completions of seeded random prompts, timed after a one-request warm-up."""
    from rl_core.generation.rollout import HFEngine, SamplingSpec

    wl = placement.workloads["hf_engine"]
    engine = HFEngine(folder, dtype=wl.dtype, workload=wl)
    requests = check_requests(vocab, args.prompts, *args.prompt_tokens)
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

    train = cfg.train.model_copy(update={"packing": pack is not None, "pack_tokens": pack or 0})
    if train.packing != cfg.train.packing:  # the arm's own kernel: packed rows take flex_attention on a GPU
        from rl_core.models.machine import Machine
        from rl_core.models.placement import plan

        placement = plan(cfg.model_copy(update={"train": train}), Machine.this())
    wl = placement.workloads["trainer"]
    model = load_model(folder, wl)
    engine = make_train_engine("deepspeed", model, train, wl.device)
    # as the train stage makes it: the head in chunks past train.logits_chunk_mb
    chunk_mb = train.logits_chunk_mb
    batch = make_batch(
        df, pad_id=1, max_tokens=cfg.rollout.max_tokens, seed=3, pack_tokens=pack, logits_mb=chunk_mb
    )
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


# --large: the update the goal names (>= 1,000 sequences, >= 400k tokens per update)
# (one timed update per arm: each is ~475k tokens)
LARGE = {
    "prompts": 256,
    "n": 4,
    "prompt_tokens": [192, 448],
    "max_tokens": 256,
    "micro_batch_size": 64,
    "repeats": 1,
}


def say(text: str) -> None:
    """A line per phase as the check goes (minutes on a GPU: nothing may look hung)."""
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


def refuse_unplanned(cfg: Any, machine: Any, args: argparse.Namespace, shape: dict[str, Any]) -> Any:
    """The placement of the check's config, or SystemExit naming the memory plan that does not fit, before
    any work: the trainer's (``rl_core.models.memory_plan``) and the HF engine's generation (its KV cache for
    every sequence at once, the step's float32 logits and the weights)."""
    from rl_core.models.machine import PlacementError
    from rl_core.models.placement import plan

    size = f"{args.prompts}x{args.n} sequences of up to {args.prompt_tokens[1]}+{args.max_tokens} tokens"
    try:
        placement = plan(cfg, machine)
    except PlacementError as e:
        sys.exit(f"gpu_check: {size} refused before any work: {e}")
    if machine.gpus:
        seqs, width = args.prompts * args.n, args.prompt_tokens[1] + args.max_tokens
        kv = shape["num_key_value_heads"] * shape["hidden_size"] // shape["num_attention_heads"]
        cache = seqs * width * shape["num_hidden_layers"] * 2 * kv * 2  # keys and values, bf16
        need = (cache + seqs * shape["vocab_size"] * 4 * 3 + matmul_params(shape) * 2) / 2**30 + 2.0
        gpu = machine.gpus[0]
        if need > gpu.memory_gib:
            sys.exit(
                f"gpu_check: {size} refused before any work: the HF engine's generation plan needs "
                f"{need:.1f} GiB on GPU 0 ({gpu.name}, {gpu.memory_gib:.1f} GiB: KV cache "
                f"{cache / 2**30:.1f} GiB for every sequence at once): lower --prompts or --n"
            )
    return placement


def measure(shape: dict[str, Any], args: argparse.Namespace, machine: Any, arms: set[str]) -> dict[str, Any]:
    """One size of the check: rlfoundry's generate and train arms (padded, packed) and the bare peer's."""
    with tempfile.TemporaryDirectory(prefix="rlf-gpu-check-") as tmp:
        t0 = time.perf_counter()
        folder = write_folder(Path(tmp) / "qwen2.5-0.5b-shape", shape)
        written = time.perf_counter() - t0
        cfg = config(folder, args)
        placement = refuse_unplanned(cfg, machine, args, shape)
        say(f"folder written ({written:.1f} s); {args.prompts}x{args.n} sequences x {args.max_tokens} tokens")
        (requests, out), gen = generate(folder, placement, args, shape["vocab_size"])
        say(f"generate (rlfoundry HF engine): {gen['tokens_per_s']} tok/s ({gen['seconds']} s)")
        wl = placement.workloads["trainer"]
        bare: dict[str, Any] = {}
        if "bare" in arms:
            flat = [r for r in requests for _ in range(args.n)]
            bare["generate"] = bare_generate(folder, flat, 1, args.max_tokens, wl.device, args.dtype)
            say(f"generate (bare transformers): {bare['generate']['tokens_per_s']} tok/s")
        df = rollouts(requests, out, args)
        train = []
        for p in (None, args.pack_tokens):
            train.append(train_arm(folder, cfg, placement, df, p, shape, args.repeats))
            say(
                f"train {'packed' if p else 'padded'} (rlfoundry): {train[-1]['tokens_per_s']} tok/s, "
                f"MFU {train[-1]['mfu']}"
            )
        if "bare" in arms:
            import torch

            from rl_core.training.ppo import make_batch

            batch = make_batch(df, pad_id=1, max_tokens=args.max_tokens, seed=3)
            try:  # the bare peer holds the whole vocabulary's float32 logits: at --large it may not fit
                bare["update"] = bare_update(
                    folder, batch, args.micro_batch_size, wl.device, args.dtype, args.repeats
                )
                say(f"train (bare PyTorch): {bare['update']['tokens_per_s']} tok/s")
            except torch.cuda.OutOfMemoryError as e:
                bare["update"] = {"error": f"out of GPU memory: {str(e).splitlines()[0]}"}
                say(f"train (bare PyTorch): {bare['update']['error']}")
                torch.cuda.empty_cache()
    padded, packed = train
    result: dict[str, Any] = {
        "folder_write_s": round(written, 1),
        "placement": placement.as_dict(),
        "generate": gen,
        "train": train,
        "bare": bare or None,
        "logprob_mismatch_mean": max(a["logprob_mismatch_mean"] for a in train),
        "logprob_mismatch_max": max(a["logprob_mismatch_max"] for a in train),
        "mfu": packed["mfu"],
        "packed_over_padded": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
    }
    if bare:  # ours over the bare peer's tokens/s (None where the bare peer did not fit)
        peer = bare["update"].get("tokens_per_s")
        result["vs_bare"] = {
            "generate": round(gen["tokens_per_s"] / bare["generate"]["tokens_per_s"], 3),
            "update_padded": round(padded["tokens_per_s"] / peer, 3) if peer else None,
            "update_packed": round(packed["tokens_per_s"] / peer, 3) if peer else None,
        }
    return result


def machine_info() -> dict[str, Any]:
    """``benchmarks.common.machine`` and the GPU: its name (None without one) and CUDA's version."""
    import torch

    from benchmarks.common import machine

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {**machine(), "gpu": gpu, "cuda": torch.version.cuda}


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
        "--arms",
        default="rlfoundry,bare",
        help="comma-separated: rlfoundry (always run) and bare (plain transformers generate and a plain "
        "PyTorch PPO update on the same work: benchmarks/gpu_bare.py): each figure with its ratio beside it",
    )
    ap.add_argument(
        "--large",
        action="store_true",
        help=f"after the default size, the large one too ({LARGE}: >= 1,000 sequences, >= 400k tokens per "
        "update), refused before any work when its memory plan does not fit the GPU",
    )
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
    arms = {a.strip() for a in args.arms.split(",") if a.strip()} | {"rlfoundry"}
    if arms - {"rlfoundry", "bare"}:
        sys.exit(f"gpu_check: --arms {args.arms!r}: each arm is rlfoundry or bare")
    shape = (
        QWEN25_05B if (args.shape or ("smoke" if args.smoke else "qwen2.5-0.5b")) != "smoke" else SMOKE_SHAPE
    )
    if args.smoke:
        args.prompts, args.n, args.prompt_tokens, args.max_tokens = 4, 2, [8, 16], 8
        args.micro_batch_size, args.repeats, args.pack_tokens = 4, 1, 48
    args.dtype = args.dtype or ("fp32" if args.smoke else "bf16")

    from rl_core.models.machine import Machine

    machine = Machine.this()
    if not machine.gpus and not (args.smoke or args.on_cpu):
        sys.exit(
            "gpu_check: torch sees no CUDA GPU (torch.cuda.is_available() is False); --smoke runs on a CPU"
        )
    large = argparse.Namespace(**{**vars(args), **LARGE}) if args.large else None
    if large is not None and not args.smoke:  # the large size's plans, before the default size's work
        with tempfile.TemporaryDirectory(prefix="rlf-gpu-plan-") as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(shape))
            refuse_unplanned(config(Path(tmp), large), machine, large, shape)
    out = result_file(args.out, OUT, args.smoke)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "gpu_check",
        "shape": "smoke" if shape is SMOKE_SHAPE else "Qwen2.5-0.5B",
        "model_config": shape,
        "matmul_params": matmul_params(shape),
        "machine": machine_info(),
        **measure(shape, args, machine, arms),
    }
    result["ratio"] = result["packed_over_padded"]
    if large is not None:
        # The default size's figures are on disk before the large size starts: a run stopped by its time
        # limit (infra/gpu_check.sh's timeout, a lent machine's budget) keeps them.
        result["large"] = {"status": "not finished"}
        if out is not None:
            Path(out).write_text(json.dumps(result, indent=2) + "\n")
            say(f"the default size written to {out}")
        say("the large size")
        result["large"] = measure(shape, large, machine, arms)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
