"""What a model folder holds beyond its weights' bytes, read as transformers reads it: the EOS ids its configs
name, a chat template kept only in the processor's ``chat_template.json``, the weights ``from_pretrained`` did
not find, and which architectures the trainer can train.

    folder_eos_ids("/models/my-llama")      # generation_config.json's eos_token_id, else config.json's
    tok = completed(tok, "/models/my-llama")  # its EOS and chat template filled in from the folder
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The heads a policy is trained through: a causal LM, or (for a supported vision-language family) a model
# that AutoModelForImageTextToText builds. Anything else (a classifier's ``score``, an encoder) is refused.
CAUSAL_LM, IMAGE_TEXT = "causal LM", "vision-language model"
# weights in formats other than safetensors (a hub folder's stale pytorch_model.bin): ``is_weight_file``'s too
OTHER_WEIGHTS = (".bin", ".bin.index.json", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")


def trainable_kind(arch: str, vlm: bool) -> str | None:
    """Which of ``CAUSAL_LM`` / ``IMAGE_TEXT`` the architecture class ``arch`` is (``vlm``: the folder is of a
    supported vision-language family), None when load_model cannot build it with its output head.

    >>> trainable_kind("LlamaForCausalLM", False), trainable_kind("LlamaForSequenceClassification", False)
    ('causal LM', None)
    """
    from transformers.models.auto import modeling_auto as auto

    def names(mapping: dict[str, Any]) -> set[str]:
        return {n for v in mapping.values() for n in ((v,) if isinstance(v, str) else v)}

    if vlm:
        return IMAGE_TEXT if arch in names(auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) else None
    return CAUSAL_LM if arch in names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) else None


def head_weight(arch: str, config: Any) -> str | None:
    """The name of the output embedding's weight in the transformers class ``arch`` built from ``config``
    (``lm_head.weight`` mostly; BioGPT's ``output_projection.weight``), built on the meta device (no memory,
    no weights); None when the class has none or cannot be built so (``load_model`` still checks the load)."""
    import torch
    import transformers

    try:
        with torch.device("meta"):
            model = getattr(transformers, arch)(config)
        head = model.get_output_embeddings()
    except Exception:  # noqa: BLE001 - a class that will not build on meta: its load is checked instead
        return None
    return next((f"{n}.weight" for n, m in model.named_modules() if m is head and n), None)


def _ids(value: Any) -> list[int]:
    return [value] if isinstance(value, int) else [int(i) for i in value or []]


def folder_eos_ids(ckpt_dir: str | Path) -> list[int]:
    """The EOS ids the folder's configs name, as transformers' generation reads them: generation_config.json's
    ``eos_token_id`` (one or a list); without that file, config.json's (or its text config's), as
    ``GenerationConfig.from_model_config`` takes them (a Llama-3.1 Instruct folder: end_of_text, eom, eot)."""
    folder = Path(ckpt_dir)
    gen = folder / "generation_config.json"
    if gen.exists():
        return _ids(json.loads(gen.read_text()).get("eos_token_id"))
    cfg = folder / "config.json"
    if not cfg.exists():
        return []
    data = json.loads(cfg.read_text())
    eos = data.get("eos_token_id")
    return _ids(eos if eos is not None else (data.get("text_config") or {}).get("eos_token_id"))


def completed(tok: Any, ckpt_dir: str | Path) -> Any:
    """``tok`` with what the folder says beside it: the chat template of ``chat_template.json`` (the file
    processors saved it in before transformers 4.47) when the tokenizer has none, and, when the tokenizer
    names no EOS token, the first EOS id of the folder's configs (``folder_eos_ids``) as its EOS, so padding
    and the warm-up's answers end as generation stops."""
    legacy = Path(ckpt_dir) / "chat_template.json"
    if not getattr(tok, "chat_template", None) and legacy.exists():
        try:
            template = json.loads(legacy.read_text()).get("chat_template")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{legacy}: not a chat template file ({e})") from None
        if isinstance(template, list):  # named templates, as tokenizer_config.json lists them
            template = {t["name"]: t["template"] for t in template}
        tok.chat_template = template or None
    eos = folder_eos_ids(ckpt_dir) if tok.eos_token_id is None else []
    if eos and tok.convert_ids_to_tokens(eos[0]) is not None:  # an id the vocabulary has
        tok.eos_token = tok.convert_ids_to_tokens(eos[0])
    return tok


def check_loaded(ckpt_dir: str | Path, model: Any, info: dict[str, Any]) -> None:
    """Refuse a model ``from_pretrained`` built with weights the folder does not hold (``info``: its loading
    info; a tied output embedding is not missing): they would be trained from random values, silently."""
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        from rl_core.models.policy_folder import ModelFolderError

        raise ModelFolderError(
            f"{ckpt_dir}: its weights lack {len(missing)} tensor(s) {type(model).__name__} needs, e.g. "
            f"{missing[:3]}: they would start at random values (the folder's weights do not match its "
            "config.json; re-save the model with save_pretrained)"
        )
