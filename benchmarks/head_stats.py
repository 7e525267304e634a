"""The work after the head's matmul, per chunk of positions, on Qwen's vocabulary on this CPU:
``rl_core.training.logprobs.logits_stats`` (one float32 log-softmax, no copy for temperature 1, the
suppression and the entropy's product in place) against the separate steps the trainer took before it
(``suppress``, ``token_logprobs``, ``entropy_from_logits``: two log-softmaxes and the copies between).

    .venv/bin/python benchmarks/head_stats.py --json [--positions 294] [--repeats 5]
    .venv/bin/python benchmarks/head_stats.py --smoke --json

A chunk is ``--positions`` positions (294: the default ``train.logits_chunk_mb`` of 512 MiB on 151,936
entries) of float32 logits from a seeded 896-wide head, with Qwen2.5's 271 unsampleable ids (151,665 to
151,935) suppressed. Two passes, as a PPO update runs them:

- ``anchor``: without grad, logprobs and entropies (the recomputed old logprobs, every chunk);
- ``train``: with grad, logprobs only, and their backward to the logits (every chunk of every micro-batch).

Each arm, ``--repeats`` times per pass interleaved ABBA (the matmul outside the clock: a fresh copy of one
chunk's logits each time); the fastest counts. Both arms' outputs are compared bit for bit. The last line
(``--json``): seconds per pass and arm, ``identical``, and ``ratio`` = separate / fused seconds over both
passes (higher: the fused path saves more).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import abba, add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "head_stats.json"
QWEN_TOKENIZER = 151_665  # Qwen2.5's tokenizer: the ids from here to the vocabulary's end never sample


def separate(logits: Any, targets: Any, never: list[int], entropy: bool) -> tuple[Any, Any]:
    """The trainer's steps before ``logits_stats``."""
    import torch

    from rl_core.models.vision import suppress
    from rl_core.training.losses import entropy_from_logits, token_logprobs

    x = suppress(logits, never)
    lp = token_logprobs(x, targets)
    with torch.no_grad():
        return lp, entropy_from_logits(x) if entropy else None


def fused(logits: Any, targets: Any, never: list[int], entropy: bool) -> tuple[Any, Any]:
    from rl_core.training.logprobs import logits_stats

    return logits_stats(logits, targets, 1.0, never, entropy, own=True)


def one_pass(logits: Any, targets: Any, never: list[int], how: Any, grad: bool) -> tuple[float, Any]:
    """Seconds of one pass over a copy of ``logits`` (and of its backward to them under grad); its outputs."""
    import torch

    with torch.set_grad_enabled(grad):
        # a non-leaf made outside the clock, as the head's output is: its gradient lands on ``zero``
        zero = torch.zeros((), requires_grad=grad)
        x = logits + zero
        t0 = time.perf_counter()
        lp, ent = how(x, targets, never, entropy=not grad)
        if grad:
            (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
        seconds = time.perf_counter() - t0
    return seconds, (lp.detach(), ent, zero.grad if grad else None)


def measure(positions: int, vocab: int, width: int, repeats: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, width, generator=g) * 0.05
    logits = torch.randn(positions, width, generator=g) @ weight.T  # the head's float32 output
    targets = torch.randint(0, min(vocab, QWEN_TOKENIZER), (positions,), generator=g)
    never = list(range(QWEN_TOKENIZER, vocab)) if vocab > QWEN_TOKENIZER else [vocab - 1]
    arms = {"separate": separate, "fused": fused}
    seconds: dict[str, dict[str, list[float]]] = {a: {"anchor": [], "train": []} for a in arms}
    outs: dict[tuple[str, str], Any] = {}
    for name in ("anchor", "train"):
        for arm in abba(("separate", "fused"), repeats):
            s, outs[(arm, name)] = one_pass(logits, targets, never, arms[arm], name == "train")
            seconds[arm][name].append(round(s, 4))
    identical = all(
        (a is None and b is None) or torch.equal(a, b)
        for name in ("anchor", "train")
        for a, b in zip(outs[("separate", name)], outs[("fused", name)], strict=True)
    )
    best = {a: {p: min(v) for p, v in by.items()} for a, by in seconds.items()}
    return {"seconds": seconds, "best_s": best, "identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--positions", type=int, default=294, help="positions in a chunk")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=3, help="ABBA rounds per pass (each arm twice a round)")
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.positions, args.vocab, args.repeats = 8, 4096, 1
    got = measure(args.positions, args.vocab, 896, args.repeats)
    best = got["best_s"]
    total = {a: sum(best[a].values()) for a in best}
    result = {
        "benchmark": "head_stats",
        "shape": {"positions": args.positions, "vocab": args.vocab, "width": 896},
        **got,
        "ratio": round(total["separate"] / total["fused"], 3),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
