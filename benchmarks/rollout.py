"""Rollout throughput: vLLM (the default engine) vs HF transformers `generate`, same model, prompts, sampling.

    .venv/bin/python benchmarks/rollout.py --json
    .venv/bin/python benchmarks/rollout.py --smoke --json   # smoke model, 8 prompts x 4 x 8 tokens, 1 repeat

Prints a summary, then as its last line one JSON object: {"vllm_tok_s", "hf_tok_s", "ratio", ...}.
Both engines sample the same batch (prompts x n completions of exactly max_tokens tokens, EOS ignored) from
the default config's model architecture; each is timed after a warm-up call.

``--stop-at-eos``: completions end at EOS as in RL (variable lengths up to max_tokens: with the untrained
policy's near-uniform next-token distribution the lengths are geometric, mean about the vocabulary size),
where scheduling matters: vLLM retires a finished sequence and keeps its batch full, HF ``generate`` steps
the whole padded batch until its longest sequence ends. Throughput counts the tokens each engine produced up
to and including EOS; the JSON records both length distributions.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, smoke_state  # noqa: E402


def _length(row: list[int], eos: int | None) -> int:
    """Tokens a completion produced: up to and including its first EOS (the rest of the row is padding)."""
    return row.index(eos) + 1 if eos is not None and eos in row else len(row)


def _summary(lengths: list[int], cap: int) -> dict[str, float]:
    return {
        "mean": round(sum(lengths) / len(lengths), 2),
        "max": max(lengths),
        "truncated_fraction": round(sum(n >= cap for n in lengths) / len(lengths), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="Config override, e.g. model.hidden_size=512",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="vLLM with torch.compile/graphs (slower start) instead of eager",
    )
    ap.add_argument("--stop-at-eos", action="store_true", help="variable lengths: stop at EOS (see above)")
    ap.add_argument("--json", action="store_true")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.n, args.max_tokens, args.repeats = 8, 4, 8, 1
        args.overrides = [*SMOKE_SHAPE, *args.overrides]
    smoke_state(args.smoke, "rollout")

    from rl_core.artifacts.paths import configure_env

    configure_env()
    import torch

    from benchmarks.common import default_policy
    from rl_core.models.model import save_checkpoint

    cfg, tasks, tok, model = default_policy(args.overrides)
    prompts = [tok(t["prompt"], add_special_tokens=False)["input_ids"] for t in tasks[: args.prompts]]
    total = args.prompts * args.n * args.max_tokens

    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, tok, d)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(
            model=d,
            dtype="float32",
            max_model_len=cfg.model.max_position,
            kv_cache_memory_bytes=256 << 20,
            enforce_eager=not args.compile,
            seed=0,
        )
        params = [
            SamplingParams(
                n=args.n, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=not args.stop_at_eos, seed=i
            )
            for i in range(len(prompts))
        ]
        reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        llm.generate(reqs, params, use_tqdm=False)
        vllm_s = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            outs = llm.generate(reqs, params, use_tqdm=False)
            vllm_s.append(time.perf_counter() - t)
        vllm_lengths = [len(c.token_ids) for o in outs for c in o.outputs]
        assert args.stop_at_eos or sum(vllm_lengths) == total, (sum(vllm_lengths), total)

    model.eval()
    width = max(map(len, prompts))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts]).repeat_interleave(args.n, 0)
    attn = (
        (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None])
        .long()
        .repeat_interleave(args.n, 0)
    )
    gen_kwargs = dict(
        attention_mask=attn,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=args.max_tokens,
        pad_token_id=pad,
        **({"eos_token_id": tok.eos_token_id} if args.stop_at_eos else {"min_new_tokens": args.max_tokens}),
    )
    with torch.no_grad():
        model.generate(ids, **gen_kwargs)
        hf_s = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = model.generate(ids, **gen_kwargs)
            hf_s.append(time.perf_counter() - t)
    eos = tok.eos_token_id if args.stop_at_eos else None
    hf_lengths = [_length(row.tolist(), eos) for row in out[:, width:]]
    assert args.stop_at_eos or sum(hf_lengths) == total, (sum(hf_lengths), total)

    vllm_tok_s, hf_tok_s = sum(vllm_lengths) / min(vllm_s), sum(hf_lengths) / min(hf_s)
    result = {
        "benchmark": "rollout",
        "tokens_per_batch": total,
        "prompts": args.prompts,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "vllm_compiled": args.compile,
        "stop_at_eos": args.stop_at_eos,
        "lengths": {
            "vllm": _summary(vllm_lengths, args.max_tokens),
            "hf": _summary(hf_lengths, args.max_tokens),
        },
        "model": cfg.model.model_dump(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vllm_seconds": vllm_s,
        "hf_seconds": hf_s,
        "vllm_tok_s": round(vllm_tok_s, 1),
        "hf_tok_s": round(hf_tok_s, 1),
        "ratio": round(vllm_tok_s / hf_tok_s, 3),
    }
    print(
        f"vLLM {vllm_tok_s:,.0f} tok/s  HF generate {hf_tok_s:,.0f} tok/s  ratio {result['ratio']:.2f}x",
        file=sys.stderr,
    )
    finish(result, None, True, args.smoke)  # the JSON line, with or without --json


if __name__ == "__main__":
    main()
