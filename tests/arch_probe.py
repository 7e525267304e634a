"""The architectures a researcher brings, each a tiny folder written here (tied and untied): vLLM (in process)
and the trainer's model must give the same logprobs on the engine's own samples, before and after new
weights reach the engine from memory and from a folder. Run by tests/integration/test_architectures.py in a
process of its own (several vLLM engines one after another); prints one JSON object of the largest gaps.

    python tests/arch_probe.py OUT_DIR qwen2:untied qwen2:tied qwen3:tied llama3:tied mistral:untied
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_core.generation.rollout import Request, SamplingSpec, VLLMEngine  # noqa: E402
from rl_core.models.model import load_model, save_with_weights  # noqa: E402
from rl_core.models.vllm_args import cpu_vllm_args  # noqa: E402
from tests.model_folders import build_tokenizer  # noqa: E402


def write_folder(arch: str, out: Path, tie: bool) -> Any:
    """``save_pretrained`` of a random tiny model of ``arch`` with the test tokenizer."""
    import transformers as t

    tok = build_tokenizer()
    common: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,  # grouped-query attention
        "max_position_embeddings": 256,
        "tie_word_embeddings": tie,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    made = {
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**common)),
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**common, head_dim=32)),  # q/k norm
        "llama3": lambda: t.LlamaForCausalLM(
            t.LlamaConfig(
                **common,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            )
        ),
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**common, sliding_window=None)),
    }
    torch.manual_seed(0)
    model = made[arch]().float()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return tok


def gap(engine: VLLMEngine, model: Any, reqs: list[Request]) -> float:
    """The largest |trainer - engine| logprob over the engine's own samples."""
    outs = engine.generate(reqs, SamplingSpec(n=2, temperature=1.0, max_tokens=6))
    worst = 0.0
    for r, comps in zip(reqs, outs, strict=True):
        for c in comps:
            ids = torch.tensor([r.prompt_ids + c.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(r.prompt_ids) - 1 : -1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            worst = max(worst, float((lp - torch.tensor(c.logprobs)).abs().max()))
    return worst


def probe(arch: str, tie: bool, out: Path) -> dict[str, float]:
    folder = out / f"{arch}-{'tied' if tie else 'untied'}"
    tok = write_folder(arch, folder, tie)
    model = load_model(folder)  # as the trainer loads it
    engine = VLLMEngine(
        folder, dtype="float32", max_model_len=128, device_args=cpu_vllm_args(128, 32), multiprocess=False
    )
    reqs = [
        Request(tok(p, add_special_tokens=False)["input_ids"], seed=i)
        for i, p in enumerate(["12+34=", "7*8="])
    ]
    got = {"start": gap(engine, model, reqs)}
    with torch.no_grad():  # a training step's worth of change, then the sync from memory
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    engine.load_weights(folder, {k: v.clone() for k, v in model.state_dict().items()})
    got["memory_sync"] = gap(engine, model, reqs)
    with torch.no_grad():  # and from a checkpoint folder (what rollout servers reload)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    new = save_with_weights(
        folder, {k: v.clone() for k, v in model.state_dict().items()}, out / f"{folder.name}-2"
    )
    engine.load_weights(new, None)
    got["folder_sync"] = gap(engine, model, reqs)
    engine.close()
    del engine
    gc.collect()
    return got


def main() -> None:
    """``ARCH:tied|untied`` cases; ``ARCH:tied-raw`` loads the tied folder into vLLM as it is (no untied
    view): the control that shows why the view exists (its syncs leave a stale output head)."""
    out = Path(sys.argv[1])
    result = {}
    for arch, tie in (arg.split(":") for arg in sys.argv[2:]):
        if tie == "tied-raw":
            import rl_core.models.engine_view

            real = rl_core.models.engine_view.engine_folder
            rl_core.models.engine_view.engine_folder = lambda ckpt: Path(ckpt)  # type: ignore[assignment]
            try:
                result[f"{arch}-{tie}"] = probe(arch, True, out / "raw")
            finally:
                rl_core.models.engine_view.engine_folder = real
        else:
            result[f"{arch}-{tie}"] = probe(arch, tie == "tied", out)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
