"""Train throughput with sequence packing (``train.packing``) vs right-padded mini-batches, same update.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/packing.py --json [--repeats 5] [--budgets 0 96 192]
    .venv/bin/python benchmarks/packing.py --extract STATE/store/RUN/iter-0001/generate/rollouts.parquet
    .venv/bin/python benchmarks/packing.py --smoke --json   # smoke policy, 32 rollouts per table, 1 repeat

The length mixes are real multi-turn tool-use rollouts (``configs/tooluse.yaml``: prompt, then model turns
and calculator observations, observation tokens masked), one iteration (256 rollouts) each, stored as length
tables (per rollout: prompt length and the completion's loss mask; ``--extract`` writes one from a run's
rollouts table): ``benchmarks/results/packing_rollouts_tooluse.json``, sampled by the policy after that
config's 500 warm-up steps (the headline ``ratio``), and ``packing_rollouts_early.json``, by a policy after 40
warm-up steps (longer, more varied episodes). Token ids and logprobs are drawn from a seed (the speed of a
forward does not depend on them). One update is ``ppo_update`` on a torch train engine over the whole
iteration (``train.micro_batch_size`` sequences per optimizer step) with the tooluse policy's shape (fresh
weights, same seed per arm); each arm is timed ``--repeats`` times after one untimed update, the arms in
turns.

Reported per arm: seconds per update, train tokens/s counted as every real (prompt + completion) token of
the iteration (loss tokens/s too), and the padding fraction of its forwards (padded: ``[B, T]`` per
mini-batch; packed: ``[rows, width]``). The first update's losses of every arm are compared with the padded
one's; ``top_ops_ms`` profiles one more update. ``ratio`` = best packed tokens/s / padded tokens/s (fastest
updates; higher = packing pays more); ``ideal_ratio`` = 1 / (1 - padded padding fraction), what removing
all padding would give if time were proportional to tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TABLES = [RESULTS / "packing_rollouts_tooluse.json", RESULTS / "packing_rollouts_early.json"]
OUT = RESULTS / "packing.json"
SMOKE_ROLLOUTS = 32  # of each table: one mini-batch of the smoke shape


def extract(parquet: Path, out: Path, policy: str) -> None:
    """Write the length table of a generate stage's rollouts (prompt lengths and completion loss masks)."""
    import pandas as pd

    df = pd.read_parquet(parquet)
    rows = [
        {"prompt": len(p), "mask": "".join(str(int(x)) for x in m)}
        for p, m in zip(df["prompt_ids"], df["loss_mask"], strict=True)
    ]
    out.write_text(json.dumps({"source": str(parquet), "policy": policy, "rollouts": rows}, indent=0) + "\n")


def frame(rows: list[dict[str, Any]], vocab: int, seed: int) -> Any:
    """A rollout table with the stored lengths and masks, ids, logprobs and advantages drawn from ``seed``."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    masks = [[int(c) for c in r["mask"]] for r in rows]
    return pd.DataFrame(
        {
            "prompt_ids": [list(rng.integers(2, vocab, r["prompt"])) for r in rows],
            "completion_ids": [list(rng.integers(2, vocab, len(m))) for m in masks],
            "logprobs": [list(rng.uniform(-2.0, -0.1, len(m))) for m in masks],
            "loss_mask": masks,
            "advantage": rng.normal(size=len(rows)),
        }
    )


def forward_padding(batch: Any, micro: int, budget: int | None) -> float:
    """Padding share of the update's forwards (mini-batches in the update's first-epoch order)."""
    import torch

    from rl_core.training.packing import pack_plan, padding_fraction

    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(batch.seed))
    real = total = 0
    for start in range(0, len(batch), micro):
        lengths = [int(n) for n in batch.attention_mask[order[start : start + micro]].sum(1)]
        if budget is None:
            rows, width = len(lengths), batch.input_ids.shape[1]
        else:
            plan = pack_plan(lengths, budget or max(lengths))
            rows, width = len(plan.rows), plan.width
        real += sum(lengths)
        total += rows * width
    return padding_fraction([real], 1, total)


def tokenizer(cfg: Any) -> Any:
    """The tool-use policy's tokenizer, trained on its environment's corpus as the init stage does."""
    from envs.base import env_class
    from rl_core.models.model import build_tokenizer

    env = env_class(cfg.task.env)()
    return build_tokenizer(env.corpus(env.tasks("train", cfg.task, 0)), cfg.model.vocab_size)


def top_ops(engine: Any, batch: Any, cfg: Any, n: int = 6) -> dict[str, float]:
    """Milliseconds of self CPU time of the ``n`` costliest ops over one more update (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from rl_core.training.ppo import ppo_update

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ppo_update(engine, batch, cfg.train)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:n]
    return {e.key: round(e.self_cpu_time_total / 1000, 1) for e in ops}


def arm(cfg: Any, tok: Any, df: Any, budget: int | None) -> dict[str, Any]:
    """A fresh policy (same seed every arm) on a torch engine, its batch (packed when ``budget`` is not None)
    and the losses of its first, untimed update."""
    from rl_core.models.model import build_model
    from rl_core.training.ppo import make_batch, ppo_update
    from rl_core.training.train_engine import make_train_engine

    model = build_model(cfg.model.model_copy(update={"max_position": 512}), tok, seed=0)
    engine = make_train_engine("torch", model, cfg.train)
    batch = make_batch(df, pad_id=1, max_tokens=cfg.rollout.max_tokens, seed=3, pack_tokens=budget)
    return {
        "engine": engine,
        "batch": batch,
        "clock": [],
        "first": ppo_update(engine, batch, cfg.train)["losses"],
    }


def summary(cfg: Any, a: dict[str, Any]) -> dict[str, Any]:
    import statistics

    import torch

    batch, best = a["batch"], min(a["clock"])
    budget = batch.pack_tokens
    return {
        "packing": budget is not None,
        "pack_tokens": budget,
        "update_s": [round(c, 4) for c in a["clock"]],
        "median_update_s": round(statistics.median(a["clock"]), 4),
        "tokens_per_s": round(int(batch.attention_mask.sum()) / best, 1),
        "loss_tokens_per_s": round(int(batch.loss_mask.sum()) / best, 1),
        "padding_fraction": round(forward_padding(batch, cfg.train.micro_batch_size, budget), 4),
        "first_update_losses": a["first"],
        "top_ops_ms": top_ops(a["engine"], batch, cfg),
        "threads": torch.get_num_threads(),
    }


def workload(
    cfg: Any, tok: Any, path: Path, budgets: list[int], repeats: int, rollouts: int | None = None
) -> dict[str, Any]:
    """Every arm (padded, then packed at each budget) on the length table ``path`` (its first ``rollouts``
    rows; all by default), timed in turns (one update of each arm per round) so that a burst of load on the
    machine hits every arm alike."""
    from rl_core.training.ppo import ppo_update

    table = json.loads(path.read_text())
    table["rollouts"] = table["rollouts"][:rollouts]
    df = frame(table["rollouts"], len(tok), seed=0)
    live = [arm(cfg, tok, df, b) for b in [None, *budgets]]
    for _ in range(repeats):
        for a in live:
            t0 = time.perf_counter()
            ppo_update(a["engine"], a["batch"], cfg.train)
            a["clock"].append(time.perf_counter() - t0)
    arms = [summary(cfg, a) for a in live]
    padded, packed = arms[0], max(arms[1:], key=lambda a: a["tokens_per_s"])
    lengths = [r["prompt"] + len(r["mask"]) for r in table["rollouts"]]
    base = padded["first_update_losses"]
    gaps = [abs(x - y) for a in arms[1:] for x, y in zip(a["first_update_losses"], base, strict=True)]
    return {
        "table": str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path),
        "policy": table.get("policy", ""),
        "rollouts": len(lengths),
        "rollout_lengths": {"min": min(lengths), "mean": sum(lengths) / len(lengths), "max": max(lengths)},
        "ideal_ratio": round(1 / (1 - padded["padding_fraction"]), 3),
        "arms": arms,
        "max_first_loss_gap": max(gaps),
        "best_pack_tokens": packed["pack_tokens"],
        "ratio": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
        "ratio_median": round(padded["median_update_s"] / packed["median_update_s"], 3),
    }


def main() -> None:
    from rl_core.schema.config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--repeats", type=int, default=5, help="timed updates per arm (the fastest counts)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 96, 192], help="train.pack_tokens per arm")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides on configs/tooluse.yaml")
    ap.add_argument("--tables", type=Path, nargs="+", default=TABLES, help="length tables (first: ratio)")
    ap.add_argument(
        "--extract", type=Path, help="write a length table (--tables' first) from a rollouts.parquet"
    )
    ap.add_argument("--policy", default="", help="with --extract: what policy sampled the rollouts")
    ap.add_argument("--out", type=Path, help=f"where the JSON result goes (default {OUT.relative_to(ROOT)})")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.extract:
        extract(args.extract, args.tables[0], args.policy)
        return
    sets, rollouts = ([*SMOKE_SHAPE, *args.set], SMOKE_ROLLOUTS) if args.smoke else (args.set, None)
    repeats = 1 if args.smoke else args.repeats
    cfg = load_config(ROOT / "configs" / "tooluse.yaml", sets)
    tok = tokenizer(cfg)
    loads = [workload(cfg, tok, t, args.budgets, repeats, rollouts) for t in args.tables]
    result = {
        "benchmark": "packing",
        "update": "ppo_update on a torch train engine, configs/tooluse.yaml policy shape and train section",
        "micro_batch_size": cfg.train.micro_batch_size,
        "tokens_counted": "all real tokens (prompt + completion) of the iteration, per second of update",
        "workloads": loads,
        "ratio": loads[0]["ratio"],
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
