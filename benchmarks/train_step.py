"""The train stage's update against a bare PyTorch loop, and against the update as it was: one process, the
arms alternating on the same batch, so the machine's drift moves them alike.

    .venv/bin/python benchmarks/train_step.py --json          # default policy, 512 rollouts, 9 rounds
    .venv/bin/python benchmarks/train_step.py --smoke --json  # smoke shape, one round

The batch: configs/default.yaml's policy (a fresh one of its shape: the seconds depend on the shapes, not on
the weights) and 512 rollouts of its training prompts (64 prompts x 8), each completion 1-8 tokens ended by
EOS, with sampling logprobs and GRPO group advantages drawn from a seeded generator. One round times one
``engine.train(batch)`` per arm: ``train.epochs`` passes of mini-batches of ``train.micro_batch_size``, one
optimizer step each (8 at the default).

Arms:
- ``deepspeed``: ``DeepSpeedTrainEngine`` (ZeRO-0, float32, one rank) as the train stage runs it now: torch's
  fused AdamW on the CPU, the gradients clipped by the engine in one foreach pass, no all-reduce at one rank.
- ``deepspeed_before``: the same engine set back to the step before (the commit that added this script):
  torch's per-tensor AdamW, DeepSpeed clipping (its own norm, parameter by parameter, after the engine's), and
  the backward's all-reduce of the gradients at one rank.
- ``bare``: the Hugging Face model and a loop as a bare PyTorch trainer writes it (what TRL's step comes
  down to): forward, the clipped surrogate with token-mean aggregation, backward, ``clip_grad_norm_``, fused
  AdamW. No statistics, no anchor bookkeeping, no DeepSpeed.

``ratio``: ``deepspeed_before``'s median seconds over ``deepspeed``'s (above 1: the update got faster);
``vs_bare``: ``bare``'s median over ``deepspeed``'s (1.0: the train engine costs nothing over a bare loop).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, add_smoke_flag, default_policy, finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def synthetic_batch(cfg: Any, tasks: list[dict], tok: Any, seed: int = 0) -> Any:
    """``prompts_per_iteration`` x ``n`` rollouts of the first training prompts: completions of 1 to
    ``max_tokens`` tokens ended by EOS, logprobs in (-3, 0), advantages of binary rewards normalised per
    group."""
    import numpy as np
    import pandas as pd

    from rl_core.models.model import pad_id
    from rl_core.training.ppo import make_batch

    rng = np.random.default_rng(seed)
    r, n = cfg.rollout, cfg.rollout.n
    vocab = [t for t in range(len(tok)) if t not in (tok.eos_token_id, pad_id(tok))]
    rows = []
    for task in tasks[: r.prompts_per_iteration]:
        prompt = tok(task["prompt"])["input_ids"]
        rewards = rng.integers(0, 2, n).astype(np.float32)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for a in adv:
            length = int(rng.integers(1, r.max_tokens + 1))
            completion = [int(x) for x in rng.choice(vocab, length - 1)] + [tok.eos_token_id]
            rows.append(
                {
                    "prompt_ids": prompt,
                    "completion_ids": completion,
                    "logprobs": list(-3 * rng.random(length)),
                    "loss_mask": [1.0] * length,
                    "advantage": float(a),
                }
            )
    return make_batch(pd.DataFrame(rows), pad_id=pad_id(tok), temperature=r.temperature, seed=seed)


def as_before(engine: Any, grad_clip: float) -> Any:
    """``engine`` with the update step it had before: per-tensor AdamW, DeepSpeed's clipping, the one-rank
    all-reduce."""
    for group in engine.optimizer.param_groups:
        group["fused"], group["foreach"] = None, False
    engine.engine._config.gradient_clipping = grad_clip
    engine.engine.enable_backward_allreduce = True
    engine.own_clip = False
    return engine


def bare_loop(model: Any, cfg: Any) -> Any:
    """One pass of mini-batches over a batch, as a bare PyTorch trainer writes it (the module docstring)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=0.0, fused=True)
    t = cfg.train

    def train(batch: Any) -> None:
        order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(batch.seed))
        for s in range(0, len(batch), t.micro_batch_size):
            rows = order[s : s + t.micro_batch_size]
            ids, mask = batch.input_ids[rows], batch.loss_mask[rows]
            logits = model(input_ids=ids, attention_mask=batch.attention_mask[rows], use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            ratio = torch.exp(logp - batch.rollout_logp[rows])
            adv = batch.advantages[rows][:, None]
            clipped = ratio.clamp(1 - t.clip_low, 1 + t.clip_high) * adv
            loss = -(torch.min(ratio * adv, clipped) * mask).sum() / mask.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    return train


def measure(rounds: int, overrides: list[str]) -> dict[str, Any]:
    import copy

    import torch

    from rl_core.training.train_engine import DeepSpeedTrainEngine

    cfg, tasks, tok, model = default_policy(overrides)
    batch = synthetic_batch(cfg, tasks, tok)
    model.train()
    arms = {
        "deepspeed": DeepSpeedTrainEngine(copy.deepcopy(model), cfg.train).train,
        "deepspeed_before": as_before(
            DeepSpeedTrainEngine(copy.deepcopy(model), cfg.train), cfg.train.grad_clip
        ).train,
        "bare": bare_loop(model, cfg),
    }
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds + 1):  # the first round warms every arm up, off the record
        for name, train in arms.items():
            t0 = time.perf_counter()
            train(batch)
            seconds[name].append(round(time.perf_counter() - t0, 4))
    timed = {k: v[1:] if rounds else v for k, v in seconds.items()}
    med = {k: statistics.median(v) for k, v in timed.items()}
    return {
        "benchmark": "train_step",
        "batch": {
            "rollouts": len(batch),
            "width": batch.input_ids.shape[1],
            "tokens": int(batch.loss_mask.sum()),
        },
        "optimizer_steps_per_round": cfg.train.epochs * -(-len(batch) // cfg.train.micro_batch_size),
        "threads": torch.get_num_threads(),
        "seconds": timed,
        "median_s": med,
        "ratio": round(med["deepspeed_before"] / med["deepspeed"], 4),
        "vs_bare": round(med["bare"] / med["deepspeed"], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (each arm once per round)")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="result file (default benchmarks/results/train_step.json)")
    add_smoke_flag(ap)
    args = ap.parse_args()
    overrides = SMOKE_SHAPE if args.smoke else []
    result = measure(0 if args.smoke else args.rounds, overrides)
    out = result_file(args.out, ROOT / "benchmarks" / "results" / "train_step.json", args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
