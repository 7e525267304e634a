"""The tiny vision-language policy: LLaVA (a SigLIP vision tower, a 2-layer projector, the Qwen2 text model).

A standard Hugging Face architecture, so the same checkpoint folder loads in transformers (the HF engine, the
trainer) and in vLLM on GPUs. An image becomes ``(image_size / patch_size) ** 2`` patch embeddings replacing
as many ``<image>`` placeholder tokens at the start of the prompt; the rollout stores those placeholder ids in
``prompt_ids`` and the image itself (PNG) beside them, so the trainer sees exactly what the engine saw.

    model = build_vlm(model_cfg, tok, seed=0, image_size=32)
    pv = pixel_values(ckpt_dir, [png_bytes])          # [1, 3, 32, 32], SigLIP normalisation
    prompt_ids = image_prefix(ckpt_dir, tok) + tok("count red\\n")["input_ids"]
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IMAGE_TOKEN = "<image>"


def build_vlm(model_cfg: Any, tokenizer: Any, seed: int, image_size: int) -> Any:
    """A randomly initialised LlavaForConditionalGeneration (fp32), deterministic in ``seed``."""
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    from rl_core.models.model import text_config

    if image_size % model_cfg.patch_size:
        raise ValueError(f"model.patch_size={model_cfg.patch_size} must divide the image size {image_size}")
    vision = SiglipVisionConfig(
        hidden_size=model_cfg.vision_hidden_size,
        intermediate_size=4 * model_cfg.vision_hidden_size,
        num_hidden_layers=model_cfg.vision_layers,
        num_attention_heads=max(1, model_cfg.vision_hidden_size // 32),
        image_size=image_size,
        patch_size=model_cfg.patch_size,
        num_channels=3,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text_config(model_cfg, tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(image_size // model_cfg.patch_size) ** 2,
        # SigLIP has no CLS token: every patch is an image token.
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    return model.float()


def image_processor(image_size: int) -> Any:
    """SigLIP's processor (PIL + numpy, no torchvision): resize, scale to [0, 1], normalise to [-1, 1]."""
    from transformers import SiglipImageProcessor

    return SiglipImageProcessor(
        size={"height": image_size, "width": image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )


def save_processor(out_dir: str | Path, tokenizer: Any, image_size: int, patch_size: int) -> None:
    """Write the image processor and a LLaVA processor config beside the model (what vLLM's loader reads)."""
    from transformers import LlavaProcessor

    proc = LlavaProcessor(
        image_processor=image_processor(image_size),
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="full",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=0,
    )
    proc.save_pretrained(str(out_dir))


NEVER = -1e9  # a logit no sampler picks; finite, so entropies and masked ratios stay finite


def unsampleable_ids(module: Any) -> list[int]:
    """Tokens a policy must never generate: the image placeholder (a completion holding one would be read as
    an image slot on the next forward pass)."""
    cfg = getattr(getattr(module, "module", module), "config", None)
    idx = getattr(cfg, "image_token_index", None) if cfg is not None else None
    return [] if idx is None else [int(idx)]


def suppress(logits: Any, ids: list[int]) -> Any:
    """``logits`` with the ``ids`` columns set to ``NEVER`` (out of place: safe under autograd). The rollout
    engine and the trainer both apply it, so sampling and training see the same distribution."""
    if not ids:
        return logits
    import torch

    return logits.index_fill(-1, torch.tensor(ids, device=logits.device), NEVER)


def is_vlm(ckpt_dir: str | Path) -> bool:
    return _config(str(ckpt_dir)).get("model_type") == "llava"


@functools.lru_cache(maxsize=16)
def _config(ckpt_dir: str) -> dict[str, Any]:
    return json.loads((Path(ckpt_dir) / "config.json").read_text())


@functools.lru_cache(maxsize=16)
def _processor(ckpt_dir: str) -> Any:
    from transformers import SiglipImageProcessor

    return SiglipImageProcessor.from_pretrained(ckpt_dir)


def image_prefix(ckpt_dir: str | Path) -> list[int]:
    """The placeholder ids an image occupies at the start of a prompt."""
    cfg = _config(str(ckpt_dir))
    return [int(cfg["image_token_index"])] * int(cfg["image_seq_length"])


def allowed_token_ids(ckpt_dir: str | Path) -> list[int] | None:
    """For an engine that takes an allow-list (vLLM): every token but the unsampleable ones, or None (all)."""
    cfg = _config(str(ckpt_dir))
    if "image_token_index" not in cfg:
        return None
    vocab = int(cfg["text_config"]["vocab_size"])
    return [i for i in range(vocab) if i != int(cfg["image_token_index"])]


def decode_image(data: bytes, where: str = "image") -> Any:
    """PNG/JPEG bytes -> an RGB PIL image; a clear error naming ``where`` if they are not an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{where}: not a readable image ({len(data)} bytes): {e}") from None
    return img.convert("RGB")


def pixel_values(ckpt_dir: str | Path, images: Sequence[bytes]) -> Any:
    """Images (encoded bytes) -> the float tensor the vision tower takes, [N, 3, H, W]."""
    import torch

    if not images:
        return None
    pil = [decode_image(b, f"image {i}") for i, b in enumerate(images)]
    out = _processor(str(ckpt_dir))(images=pil, return_tensors="pt")["pixel_values"]
    return out.to(torch.float32)
