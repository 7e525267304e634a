"""The HF engine's generation on Qwen2.5-0.5B's shape on this CPU: the head on each step's last position only
(``logits_to_keep=1``, what the engine asks now) against the whole prompt's logits (what it asked before), and
plain transformers ``generate`` on the same requests beside them (issue 38's bare peer).

    .venv/bin/python benchmarks/hf_generate.py --json [--prompts 4] [--n 2] [--max-tokens 32] [--repeats 4]
    .venv/bin/python benchmarks/hf_generate.py --smoke --json

The folder is the GPU check's (``benchmarks/gpu_check.py: write_folder``: Qwen2.5-0.5B's exact config,
vocabulary 151,936, random bf16 weights, float32 here), the requests its seeded prompts
(``check_requests``) of ``--prompt-tokens`` tokens. Arms, in one process, ABBA over ``--repeats`` rounds,
after one untimed call of the full size:
``last`` (``HFEngine`` as it is), ``whole`` (the same engine with ``last_only`` emptied: the first step's
forward computes batch x prompt x vocabulary logits and keeps one row of them), ``bare``
(``benchmarks/gpu_bare.py: bare_generate``, its own model). The two engine arms' completions are compared
token and logprob bit for bit.

The last line (``--json``): each arm's seconds (every round, the fastest, the median), new tokens and
tokens/s (at the median), ``identical``, ``vs_bare`` (ours over the bare peer's tokens/s) and ``ratio`` =
whole / last median seconds (higher: the last-position head saves more; ``best_ratio``: of the fastest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import abba, add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "hf_generate.json"


def engine_arm(engine: Any, reqs: list[Any], spec: Any, last: bool) -> tuple[float, list[Any]]:
    """Seconds of one ``generate`` with the head on the last position (``last``) or on every position."""
    engine.last_only = {"logits_to_keep": 1} if last else {}
    t0 = time.perf_counter()
    out = engine.generate(reqs, spec)
    return time.perf_counter() - t0, [(c.token_ids, c.logprobs) for cs in out for c in cs]


def measure(folder: Path, reqs: list[Any], n: int, max_tokens: int, rounds: int) -> dict[str, Any]:
    """The three arms, ABBA for the engine's two, the bare peer once a round."""
    from benchmarks.gpu_bare import bare_generate
    from rl_core.generation.rollout import HFEngine, SamplingSpec

    engine = HFEngine(folder)
    spec = SamplingSpec(n=n, temperature=1.0, max_tokens=max_tokens)
    engine.generate(reqs, spec)  # untimed, the full size: the first call's allocations touch fresh pages
    seconds: dict[str, list[float]] = {"last": [], "whole": [], "bare": []}
    outs: dict[str, list[Any]] = {}
    tokens = {}
    for arm in abba(("last", "whole"), rounds):
        s, outs[arm] = engine_arm(engine, reqs, spec, arm == "last")
        seconds[arm].append(round(s, 3))
        tokens[arm] = sum(len(t) for t, _ in outs[arm])
        if len(seconds[arm]) > len(seconds["bare"]):  # once a round, between the engine's arms
            flat = [r for r in reqs for _ in range(n)]
            bare = bare_generate(folder, flat, 1, max_tokens, "cpu", "fp32")
            seconds["bare"].append(bare["seconds"])
            tokens["bare"] = bare["new_tokens"]  # its rows end at their first EOS too
    arms = {
        arm: {"seconds": s, "best_s": min(s), "median_s": statistics.median(s), "new_tokens": tokens[arm]}
        | {"tokens_per_s": round(tokens[arm] / statistics.median(s), 1)}
        for arm, s in seconds.items()
    }
    return {"arms": arms, "identical": outs["last"] == outs["whole"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=2, help="completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[64, 192], metavar=("MIN", "MAX"))
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per completion")
    ap.add_argument("--repeats", type=int, default=4, help="ABBA rounds of the engine's two arms")
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    add_smoke_flag(ap)
    args = ap.parse_args()
    from benchmarks.gpu_check import QWEN25_05B, SMOKE_SHAPE, check_requests, write_folder

    shape = SMOKE_SHAPE if args.smoke else QWEN25_05B
    if args.smoke:
        args.prompts, args.n, args.prompt_tokens, args.max_tokens, args.repeats = 2, 2, [8, 16], 4, 1
    with tempfile.TemporaryDirectory(prefix="rlf-hf-generate-") as tmp:
        folder = write_folder(Path(tmp) / "qwen2.5-0.5b-shape", shape)
        reqs = check_requests(shape["vocab_size"], args.prompts, *args.prompt_tokens)
        got = measure(folder, reqs, args.n, args.max_tokens, args.repeats)
    arms = got["arms"]
    result = {
        "benchmark": "hf_generate",
        "shape": "smoke" if args.smoke else "Qwen2.5-0.5B",
        "dtype": "float32",
        "sequences": args.prompts * args.n,
        "prompt_tokens": sum(len(r.prompt_ids) for r in reqs),
        "max_tokens": args.max_tokens,
        **got,
        "vs_bare": round(arms["last"]["tokens_per_s"] / arms["bare"]["tokens_per_s"], 3),
        "best_ratio": round(arms["whole"]["best_s"] / arms["last"]["best_s"], 3),
        "ratio": round(arms["whole"]["median_s"] / arms["last"]["median_s"], 3),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
