"""The GPU check's bare peer (``benchmarks/gpu_check.py --arms ...,bare``): the same work in plain
transformers and PyTorch, on the same folder, requests and rollouts, measured in the same run, so that every
rlfoundry figure has its ratio beside it.

- generate: ``model.generate`` on the left-padded batch of every request x ``n`` (sdpa, the check's dtype,
  pure sampling: temperature 1, no top-k or top-p), new tokens up to and with each row's first EOS;
- update: a PPO-shaped update in plain PyTorch: float32 weights under bf16 autocast (fp32: none), fused AdamW
  on a GPU, one optimizer step per ``micro_batch_size`` sequences (each mini-batch cut to its longest row),
  an extra no-grad forward for the old logprobs, the whole vocabulary's float32 log-softmax, the clipped loss
  over the mini-batch's tokens.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PAD_ID = 1  # the check's folder: EOS 0, PAD 1 (benchmarks/gpu_check.py: word_tokenizer)


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


def _model(folder: Path, device: str, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    return model.to(device)


def bare_generate(
    folder: Path, requests: list[Any], n: int, max_tokens: int, device: str, dtype: str
) -> dict:
    """Plain ``model.generate`` of ``n`` samples per request; its wall seconds and tokens/s."""
    import torch

    model = _model(folder, device, {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]).eval()
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.tensor([[PAD_ID] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in requests])
    attn = (ids != PAD_ID).long()
    args = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": max_tokens}
    args |= {"num_return_sequences": n, "pad_token_id": PAD_ID, "eos_token_id": 0, "min_new_tokens": 1}
    torch.manual_seed(0)
    model.generate(
        input_ids=ids[:1].to(device),
        attention_mask=attn[:1].to(device),
        **(args | {"num_return_sequences": 1, "max_new_tokens": 4}),
    )
    with Meter(device) as m, torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), **args)
    new = out[:, width:].cpu()
    stops = (new == 0).int()
    # a row's tokens: up to and with its first EOS, else all
    first = torch.where(stops.any(1), stops.argmax(1) + 1, torch.full((len(new),), new.shape[1]))
    tokens = int(first.sum())
    return {
        "seconds": round(m.seconds, 3),
        "new_tokens": tokens,
        "tokens_per_s": round(tokens / m.seconds, 1),
    }


def bare_update(
    folder: Path, batch: Any, micro_batch_size: int, device: str, dtype: str, repeats: int
) -> dict:
    """``repeats`` timed plain-PyTorch PPO updates over ``batch`` (``rl_core.training.ppo.Batch``'s padded
    tensors, read only) after one untimed; the fastest counts."""
    import torch

    model = _model(folder, device, torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.startswith("cuda"))
    cast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16")
    lengths = batch.attention_mask.sum(1)

    def logp(ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        with cast:
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]

    def update() -> None:
        for start in range(0, len(lengths), micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            width = int(lengths[rows].max())
            ids = batch.input_ids[rows, :width].to(device)
            attn = batch.attention_mask[rows, :width].to(device)
            mask = batch.loss_mask[rows, : width - 1].to(device)
            adv = batch.advantages[rows].to(device)[:, None]
            with torch.no_grad():
                old = logp(ids, attn)
            ratio = torch.exp(logp(ids, attn) - old)
            surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
            loss = -(surr * mask).sum() / mask.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

    update()
    clock = []
    for _ in range(repeats):
        with Meter(device) as m:
            update()
        clock.append(m.seconds)
    tokens = int(lengths.sum())
    return {
        "update_s": [round(c, 4) for c in clock],
        "tokens": tokens,
        "tokens_per_s": round(tokens / min(clock), 1),
    }
