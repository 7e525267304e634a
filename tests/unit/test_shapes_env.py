"""The multimodal counting environment and the tiny LLaVA policy: the answer is in the pixels (checked from
the rendered image, not from the scene), tasks and images are reproducible, the HF engine conditions on the
image, and the trainer recomputes exactly the logprobs the engine sampled with."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from envs.base import make_env
from envs.shapes import CELL, COLORS, GRID, QUESTIONS
from rl_core.generation.rollout import HFEngine, Request, SamplingSpec, start_engine
from rl_core.models.model import build_tokenizer, load_model, save_checkpoint, save_weights
from rl_core.models.vision import (
    IMAGE_TOKEN,
    allowed_token_ids,
    build_vlm,
    image_prefix,
    pixel_values,
    save_processor,
)
from rl_core.schema.config import load_config
from rl_core.training.ppo import make_batch, sequence_logprobs

CFG = load_config("configs/shapes.yaml", ["task.train_size=300", "task.heldout_size=40"])


def _count_from_pixels(png: bytes, question: str) -> int:
    """Count shapes by reading the picture: a cell holds a shape when its centre is not white; its colour is
    the nearest palette colour; a square fills its cell's corner-adjacent pixel, a circle does not."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    n = 0
    for cell in range(GRID * GRID):
        y0, x0 = (cell // GRID) * CELL, (cell % GRID) * CELL
        centre = img[y0 + CELL // 2, x0 + CELL // 2]
        if (centre > 240).all():
            continue
        color = min(COLORS, key=lambda c: np.abs(np.array(COLORS[c]) - centre).sum())
        kind = "square" if not (img[y0 + 1, x0 + 1] > 240).all() else "circle"
        n += question in ("all", color, kind)
    return n


def test_answers_are_what_the_image_shows():
    env = make_env("shapes")
    tasks = env.tasks("train", CFG.task, seed=0)
    assert {t["op"] for t in tasks} == set(QUESTIONS)
    for t in tasks:
        assert _count_from_pixels(env.image(t), t["op"]) == int(t["answer"])
        # the text carries only the question: without the image the answer cannot be known
        assert t["prompt"] == f"count {t['op']}\n"


def test_tasks_and_images_are_reproducible_and_splits_disjoint():
    env = make_env("shapes")
    a, b = env.tasks("train", CFG.task, seed=3), env.tasks("train", CFG.task, seed=3)
    assert a == b and [env.image(t) for t in a[:20]] == [env.image(t) for t in b[:20]]
    assert a != env.tasks("train", CFG.task, seed=4)
    held = env.tasks("heldout", CFG.task, seed=3)
    assert not {t["key"] for t in a} & {t["key"] for t in held}


@pytest.mark.parametrize("action", ["", "two", "2 3", "\x00", "9" * 5000, "-1\n", " 2 "])
def test_malformed_answers_never_raise(action):
    env = make_env("shapes")
    task = env.tasks("train", CFG.task, seed=0)[0]
    env.reset(task, seed=0)
    out = env.step(action)
    assert out.done
    assert out.outcome["correct"] == (action.strip() == task["answer"])
    assert out.outcome["well_formed"] == (action.strip().lstrip("-").isdigit() and len(action.strip()) <= 64)


def test_corrupt_image_bytes_are_named(tmp_path):
    ckpt = _vlm_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="image 1: not a readable image"):
        pixel_values(ckpt, [make_env("shapes").image(_task()), b"\x89PNG broken"])


def _task(i: int = 0) -> dict:
    return make_env("shapes").tasks("train", CFG.task, seed=0)[i]


def _vlm_checkpoint(tmp_path: Path) -> Path:
    env = make_env("shapes")
    tasks = env.tasks("train", CFG.task, seed=0)
    tok = build_tokenizer(env.corpus(tasks), CFG.model.vocab_size, [IMAGE_TOKEN])
    model = build_vlm(CFG.model, tok, seed=0, image_size=env.image_size)
    d = tmp_path / "vlm"
    save_checkpoint(model, tok, d)
    save_processor(d, tok, env.image_size, CFG.model.patch_size)
    return d


def test_engine_conditions_on_the_image_and_trainer_agrees(tmp_path):
    ckpt = _vlm_checkpoint(tmp_path)
    env = make_env("shapes")
    eng = HFEngine(ckpt)
    tok = eng.tokenizer
    tasks = [_task(i) for i in range(6)]
    ids = [image_prefix(ckpt) + tok(t["prompt"], add_special_tokens=False)["input_ids"] for t in tasks]
    assert ids[0][: len(image_prefix(ckpt))] == [tok.convert_tokens_to_ids(IMAGE_TOKEN)] * 16
    reqs = [
        Request(x, seed=10 + i, images=(env.image(t),))
        for i, (x, t) in enumerate(zip(ids, tasks, strict=True))
    ]
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=3)
    outs = eng.generate(reqs, spec)
    again = eng.generate(list(reversed(reqs)), spec)[::-1]  # per-request seeds: batch order does not matter
    assert [[c.token_ids for c in o] for o in outs] == [[c.token_ids for c in o] for o in again]

    # the image matters: the same text with another picture gives other next-token logits
    model = load_model(ckpt).eval()
    x = torch.tensor([ids[0]])
    other = next(t for t in (_task(i) for i in range(6, 60)) if t["prompt"] == tasks[0]["prompt"])
    with torch.no_grad():
        a = model(input_ids=x, pixel_values=pixel_values(ckpt, [env.image(tasks[0])])).logits[0, -1]
        b = model(input_ids=x, pixel_values=pixel_values(ckpt, [env.image(other)])).logits[0, -1]
    assert (a - b).abs().max() > 1e-4

    # trainer side: logprobs recomputed from the stored rollout (ids + PNG) equal the engine's logprobs
    rows = [
        {
            "prompt_ids": x,
            "completion_ids": c.token_ids,
            "logprobs": c.logprobs,
            "loss_mask": [1] * len(c.token_ids),
            "advantage": 0.0,
            "image": env.image(t),
        }
        for x, t, o in zip(ids, tasks, outs, strict=True)
        for c in o
    ]
    batch = make_batch(pd.DataFrame(rows), pad_id=tok.pad_token_id, ckpt_dir=ckpt)
    assert batch.vision["pixel_values"].shape == (len(rows), 3, 32, 32)
    lp, _ = sequence_logprobs(model, batch, chunk=7)
    diff = ((lp - batch.rollout_logp).abs() * batch.loss_mask).max()
    assert diff < 1e-4, diff
    # ...and dropping the images would change them (the check above is not vacuous)
    batch.vision = {"pixel_values": torch.zeros_like(batch.vision["pixel_values"])}
    lp0, _ = sequence_logprobs(model, batch, chunk=7)
    assert ((lp0 - lp).abs() * batch.loss_mask).max() > 1e-4


def test_engine_loads_trainer_weights_strictly(tmp_path):
    ckpt = _vlm_checkpoint(tmp_path)
    eng = HFEngine(ckpt)
    trained = load_model(ckpt)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    new = tmp_path / "new"
    new.mkdir()
    for f in ckpt.iterdir():
        if f.name != "model.safetensors":
            (new / f.name).write_bytes(f.read_bytes())
    save_weights(trained.state_dict(), new)  # the trainer's key layout, not save_pretrained's
    eng.load_weights(new)
    for (k, a), b in zip(eng.model.state_dict().items(), trained.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_vllm_on_cpu_refuses_a_vision_model_with_a_clear_error(tmp_path):
    ckpt = _vlm_checkpoint(tmp_path)
    if torch.cuda.is_available():
        pytest.skip("this check is about CPU-only machines")
    with pytest.raises(ValueError, match="use rollout.engine=hf"):
        start_engine("vllm", ckpt, CFG.rollout, max_model_len=32)


def test_the_image_placeholder_is_never_sampled(tmp_path):
    """A policy that prefers the placeholder still never emits it (a completion holding one breaks the next
    forward pass), and the trainer computes logprobs under the same restriction."""
    ckpt = _vlm_checkpoint(tmp_path)
    model = load_model(ckpt)
    image_id = model.config.image_token_index
    with torch.no_grad():
        model.lm_head.weight[image_id] = model.lm_head.weight.abs().max() * 50  # the placeholder dominates
    biased = tmp_path / "biased"
    biased.mkdir()
    for f in ckpt.iterdir():
        if f.name != "model.safetensors":
            (biased / f.name).write_bytes(f.read_bytes())
    save_weights(model.state_dict(), biased)
    env = make_env("shapes")
    eng = HFEngine(biased)
    task = _task()
    ids = image_prefix(biased) + eng.tokenizer(task["prompt"], add_special_tokens=False)["input_ids"]
    outs = eng.generate([Request(ids, seed=1, images=(env.image(task),))], SamplingSpec(n=16, max_tokens=3))
    assert all(image_id not in c.token_ids for c in outs[0])
    allowed = allowed_token_ids(biased)  # vLLM's allow-list on GPUs: the same restriction
    assert image_id not in allowed and len(allowed) == model.config.text_config.vocab_size - 1
    rows = [
        {
            "prompt_ids": ids,
            "completion_ids": c.token_ids,
            "logprobs": c.logprobs,
            "loss_mask": [1] * len(c.token_ids),
            "advantage": 0.0,
            "image": env.image(task),
        }
        for c in outs[0]
    ]
    batch = make_batch(pd.DataFrame(rows), pad_id=eng.tokenizer.pad_token_id, ckpt_dir=biased)
    lp, ent = sequence_logprobs(load_model(biased).eval(), batch, chunk=16)
    assert ((lp - batch.rollout_logp).abs() * batch.loss_mask).max() < 1e-4
    assert torch.isfinite(ent).all()


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (width, height)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def test_hostile_image_bytes_are_refused_before_they_are_decoded():
    """A PNG header declaring billions of pixels (69 bytes), one of 144 Mpx that compresses to ~0.4 MB, a
    chunk whose checksum is broken, a string instead of bytes: each a ValueError naming the image, none
    decoded (a 12000 x 12000 image had taken 2.5 GB and 12 s to become a 32 x 32 tensor)."""
    import struct
    import time
    import zlib

    from rl_core.models.vision import decode_image

    def header_only(w: int, h: int) -> bytes:
        ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
        chunk = b"IHDR" + ihdr
        return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))

    big = _png(12_000, 12_000)
    broken = bytearray(_png(8, 8))
    broken[38] ^= 0xFF  # the type of the chunk after the header
    t0 = time.perf_counter()
    for data in (header_only(50_000, 50_000), big, bytes(broken), "not bytes"):
        with pytest.raises(ValueError, match="row 3 image 0: "):
            decode_image(data, "row 3 image 0")  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 5
    assert decode_image(_png(64, 48), "ok").size == (64, 48)
