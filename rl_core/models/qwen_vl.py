"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL folders on the CPU stack: their processor without torchvision.

transformers' ``AutoProcessor`` of such a folder as the hub ships it builds the video processor too, which
needs torchvision (absent here); ``rl_core.models.vision.processor`` then calls ``images_only``.
"""

from __future__ import annotations

from typing import Any

from rl_core.models.vision import _config

# a Qwen-VL model type -> its processor class in transformers
_QWEN_PROCESSORS = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
}


def images_only(ckpt_dir: str) -> Any:
    """A Qwen-VL folder's processor assembled from its image processor (the PIL backend) and its tokenizer,
    without the video processor, which needs torchvision (absent from the CPU stack): the model type's own
    processor class, its expansion of ``<|image_pad|>`` and its chat template, for images only."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    base = getattr(transformers, _QWEN_PROCESSORS[_config(ckpt_dir)["model_type"]])

    class ImagesOnly(base):  # type: ignore[misc, valid-type]
        def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    try:
        images = AutoImageProcessor.from_pretrained(ckpt_dir)
        tok = AutoTokenizer.from_pretrained(ckpt_dir)
    except (OSError, ValueError, ImportError) as e:
        raise ValueError(
            f"its processor cannot be assembled from its image processor and tokenizer: {e}"
        ) from None
    return ImagesOnly(
        image_processor=images, tokenizer=tok, video_processor=None, chat_template=tok.chat_template
    )
