"""DeepSpeed's bf16 mode through rlfoundry's train engine on this CPU (gloo, a world of one): run by
tests/integration/test_bf16_trainer.py in its own process (DeepSpeed's process group stays for the process's
life). Prints one JSON object of what the test checks, per ZeRO stage."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _model(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _step(engine: Any, ids: torch.Tensor) -> float:
    loss = engine.module(input_ids=ids, labels=ids).loss
    return engine.backward_step(loss)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    from rl_core.schema.config import config_from_dict
    from rl_core.training.train_engine import make_train_engine

    out: dict[str, Any] = {}
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    for stage in (1, 2):
        cfg = config_from_dict({"train": {"dtype": "bf16", "zero_stage": stage, "micro_batch_size": 4}}).train
        model = _model()
        w0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
        eng = make_train_engine("deepspeed", model, cfg, "cpu")
        masters = eng.weights()
        r: dict[str, Any] = {
            "module_dtypes": sorted({str(p.dtype) for p in eng.engine.module.parameters()}),
            "weights_dtypes": sorted({str(v.dtype) for v in masters.values()}),
            "masters_are_the_loaded_fp32": _same(masters, w0),
            "bf16_copy_would_differ": not _same({k: v.bfloat16().float() for k, v in w0.items()}, w0),
        }
        _step(eng, ids)
        w1 = eng.weights()
        r["moved"] = not _same(w1, w0)
        r["module_is_masters_rounded"] = all(
            torch.equal(p.detach().cpu(), w1[n].bfloat16()) for n, p in eng.engine.module.named_parameters()
        )
        # Resume: a new engine from the float32 weights and the stored optimizer state steps exactly as the
        # uninterrupted one does.
        state = eng.optimizer_state()
        again = _model(seed=7)
        again.load_state_dict(w1)
        eng2 = make_train_engine("deepspeed", again, cfg, "cpu")
        eng2.load_optimizer_state(state)
        r["resumed_weights_equal"] = _same(eng2.weights(), w1)
        _step(eng, ids)
        _step(eng2, ids)
        r["resumed_step_equal"] = _same(eng2.weights(), eng.weights())
        out[f"zero{stage}"] = r
    print(json.dumps(out))


if __name__ == "__main__":
    main()
