"""Your own model as the policy: a Hugging Face ``save_pretrained`` folder named by ``model.path``.

The folder (a local path, ``file://`` or an fsspec URL such as ``s3://bucket/model``) is checked before any
work — a bad one stops the run with ``ModelFolderError`` naming the path and what is missing — and then put
into the store unchanged as the run's base checkpoint, which vLLM, the HF engine and the trainer all load as
is. What a policy folder must hold:

- ``config.json`` with ``architectures``: a causal LM (not a classifier: its LM head would start at random)
  or a supported VLM that transformers builds and, with ``rollout.engine=vllm``, that vLLM's model registry
  lists; tied or untied embeddings (below; untied, the weights hold the output embedding);
- ``model.safetensors``, or the shards ``model.safetensors.index.json`` names (as ``save_pretrained`` writes
  a model above its ``max_shard_size``; the run's own checkpoints are sharded above ``model.max_shard_size``),
  each file as long as its header says;
- ``tokenizer.json`` (+ ``tokenizer_config.json``), with an EOS token here or in ``generation_config.json``
  (without it, ``config.json``); a chat template that renders a user message, when one is used
  (``model.chat_template``; ``chat_template.json`` is read too);
- for a VLM, the image processor (``preprocessor_config.json``, or ``processor_config.json`` holding it).

Tied input/output embeddings (Qwen2.5/Qwen3 small models, Llama-3.2, Gemma) are trained tied and saved
tied; vLLM, whose in-place reload never re-ties them, loads an untied view (``rl_core.models.engine_view``). A
vision-language model with tied embeddings is refused for now.

    info = check_policy_folder("/models/my-llama", chat_template="auto", max_model_len=512, vllm=True)
    local = fetch_policy_folder("s3://bucket/my-llama", "/tmp/x")   # its files in a local folder
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
from pathlib import Path
from typing import Any

from rl_core.models.folder_checks import OTHER_WEIGHTS, head_weight, trainable_kind
from rl_core.models.model import (
    INDEX,
    WEIGHTS,
    has_chat_template,
    load_tokenizer,
    render_prompt,
    stop_ids,
)
from rl_core.schema.config import ConfigError

_LARGE = (".safetensors", *OTHER_WEIGHTS)  # weight files: not fetched just to check the folder


class ModelFolderError(ConfigError):
    """``model.path`` is not a usable policy folder; the message names the path and what is wrong."""


def _fs(path: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(path)


def _files(path: str) -> tuple[Any, str, dict[str, int]]:
    """The filesystem, the folder's path on it and its top-level files (name -> size). An object store that
    does not answer is a StoreUnavailable naming the endpoint, as the run store's is."""
    from rl_core.artifacts.retries import StoreUnavailable, s3_endpoint, transient
    from rl_core.schema.config_secrets import redacted

    fs, root = _fs(path)
    try:
        if not fs.isdir(root):
            raise ModelFolderError(f"model.path {path}: no such folder")
        listing = fs.ls(root, detail=True)
    except Exception as e:
        if not transient(e):
            raise
        where = s3_endpoint() if path.startswith("s3://") else path.split("://", 1)[0]
        raise StoreUnavailable(
            f"model.path {redacted(path)}: the object store ({where}) is unreachable ({type(e).__name__})"
        ) from e
    files = {}
    for info in listing:
        if info.get("type") == "file":
            files[info["name"].rstrip("/").rsplit("/", 1)[-1]] = int(info.get("size") or 0)
    return fs, root, files


def fetch_policy_folder(path: str, dest: str | Path, *, large: bool = True) -> Path:
    """``dest`` holding the policy folder's top-level files (not hidden ones; weights only when ``large``):
    links to a local folder's files, copies of a remote one's."""
    fs, root, files = _files(path)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(files):
        if name.startswith(".") or not (large or not name.endswith(_LARGE)):
            continue
        if local:
            (out / name).symlink_to(Path(root) / name)
        else:
            fs.get(f"{root}/{name}", str(out / name))
    return out


def _header(path: str, fs: Any, root: str, name: str, size: int) -> dict[str, Any]:
    """The safetensors header of ``name`` (``size`` bytes), whose tensors must end where the file does: a
    truncated copy (an interrupted download) is refused here, not mid-run by the loader."""
    try:
        with fs.open(f"{root}/{name}", "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, MemoryError, OSError, KeyError, TypeError, IndexError) as e:
        raise ModelFolderError(f"model.path {path}: {name} is not a safetensors file ({e})") from None
    if 8 + n + end != size:
        what = "truncated (an incomplete copy or download?)" if size < 8 + n + end else "longer than that"
        raise ModelFolderError(
            f"model.path {path}: {name} is {size} bytes but its header says its tensors end at byte "
            f"{8 + n + end}: the file is {what}; copy it again"
        )
    return header


def _weights(path: str, fs: Any, root: str, files: dict[str, int]) -> tuple[int, set[str]]:
    """The parameter count and the tensor names from the safetensors headers (one ``model.safetensors``, or
    the shards its index names, every tensor of the index in the shard it names, each shard whole); the
    folder's weights problem otherwise."""
    if INDEX in files:
        try:
            with fs.open(f"{root}/{INDEX}", "rb") as f:
                weight_map = json.loads(f.read())["weight_map"]
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise ModelFolderError(f"model.path {path}: {INDEX} is not a shard index ({e})") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if s not in files]
        if missing:
            raise ModelFolderError(
                f"model.path {path}: {INDEX} names shards that are not there: {missing[:3]}"
            )
        headers = {s: _header(path, fs, root, s, files[s]) for s in shards}
        for tensor, shard in weight_map.items():
            if tensor not in headers[shard]:
                raise ModelFolderError(
                    f"model.path {path}: {INDEX} puts {tensor} in {shard}, which does not hold it"
                )
        tensors = {k: v["shape"] for h in headers.values() for k, v in h.items() if k != "__metadata__"}
        return sum(math.prod(s) for s in tensors.values()), set(tensors)
    if WEIGHTS not in files:
        found = [n for n in files if n.endswith(_LARGE)]
        hint = f" (found {', '.join(sorted(found))}: re-save with safe_serialization=True)" if found else ""
        raise ModelFolderError(f"model.path {path}: no weights ({WEIGHTS}){hint}")
    header = _header(path, fs, root, WEIGHTS, files[WEIGHTS])
    tensors = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        raise ModelFolderError(f"model.path {path}: {WEIGHTS} holds no tensors")
    return sum(math.prod(s) for s in tensors.values()), set(tensors)


def _architecture(path: str, local: Path, vllm: bool, max_model_len: int) -> tuple[str, Any]:
    """The folder's architecture, checked against transformers (the trainer, the HF engine) and vLLM."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(local))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; all mean the same here
        raise ModelFolderError(
            f"model.path {path}: config.json cannot be read by transformers ({e})"
        ) from None
    arch = (getattr(config, "architectures", None) or [""])[0]
    if not arch:
        raise ModelFolderError(f"model.path {path}: config.json names no architecture ('architectures')")
    import transformers

    if not hasattr(transformers, arch):
        raise ModelFolderError(f"model.path {path}: architecture {arch} is not a transformers model class")
    text = config.get_text_config()
    from rl_core.models.vision import expands_in_processor, family, processor

    if text is not config and family(local) is None:
        raise ModelFolderError(
            f"model.path {path}: vision-language model type {config.model_type!r} is not supported (LLaVA, "
            "Idefics3, SmolVLM, Qwen2-VL, Qwen2.5-VL and Qwen3-VL are)"
        )
    if trainable_kind(arch, family(local) is not None) is None:
        raise ModelFolderError(
            f"model.path {path}: config.json's architecture {arch} is not a causal language model (a "
            "*ForCausalLM) nor a supported vision-language model: a policy generates text through its LM head"
        )
    if vllm:
        from vllm import ModelRegistry

        if arch not in ModelRegistry.get_supported_archs():
            raise ModelFolderError(
                f"model.path {path}: architecture {arch} cannot be loaded by vLLM (not in its model "
                "registry); use a vLLM-supported architecture or rollout.engine=hf"
            )
    if expands_in_processor(local):  # the processor is the source of ids and pixels: it must assemble
        try:
            processor(str(local))
        except ValueError as e:
            raise ModelFolderError(f"model.path {path}: {e}") from None
    longest = getattr(text, "max_position_embeddings", None)
    if longest is not None and max_model_len > longest:
        raise ModelFolderError(
            f"model.path {path}: model.max_position={max_model_len} exceeds the model's "
            f"max_position_embeddings={longest}"
        )
    return arch, config


def _tokenizer(path: str, local: Path, chat_template: bool | str) -> Any:
    """The folder's tokenizer, its EOS ids and (when used) its chat template, checked."""
    try:
        tok = load_tokenizer(local)
    except Exception as e:  # noqa: BLE001
        raise ModelFolderError(f"model.path {path}: the tokenizer cannot be loaded ({e})") from None
    if not stop_ids(local, tok):
        raise ModelFolderError(
            f"model.path {path}: no EOS token (neither tokenizer_config.json's eos_token nor "
            "generation_config.json's eos_token_id): generation could never stop"
        )
    if chat_template is True and not has_chat_template(tok):
        raise ModelFolderError(f"model.path {path}: model.chat_template is true but the tokenizer has none")
    if has_chat_template(tok) and chat_template is not False:
        try:
            ids = tok(render_prompt(tok, [{"role": "user", "content": "1+1="}]), add_special_tokens=False)
        except Exception as e:  # noqa: BLE001 - Jinja errors of every kind
            raise ModelFolderError(
                f"model.path {path}: the chat template does not render a user message: "
                f"{type(e).__name__}: {e}"
            ) from None
        if not ids["input_ids"]:
            raise ModelFolderError(f"model.path {path}: the chat template renders an empty prompt")
    return tok


def check_policy_folder(
    path: str, *, chat_template: bool | str = "auto", max_model_len: int = 64, vllm: bool = True
) -> dict[str, Any]:
    """Check a policy folder before any work (see the module docstring); returns what was found
    (architecture, parameters, vocab size). Raises ``ModelFolderError`` naming the path and the problem."""
    fs, root, files = _files(path)
    if "config.json" not in files:
        raise ModelFolderError(f"model.path {path}: no config.json (not a save_pretrained folder)")
    if "tokenizer.json" not in files:
        raise ModelFolderError(
            f"model.path {path}: no tokenizer (tokenizer.json); save it beside the model "
            "(tokenizer.save_pretrained(path))"
        )
    parameters, tensors = _weights(path, fs, root, files)
    with tempfile.TemporaryDirectory() as d:
        local = fetch_policy_folder(path, d, large=False)
        arch, config = _architecture(path, local, vllm, max_model_len)
        _has_head(path, arch, config, tensors)
        if getattr(config, "model_type", "") == "llava" and not _has_image_processor(Path(local), files):
            raise ModelFolderError(
                f"model.path {path}: a LLaVA model needs its image processor (preprocessor_config.json, or "
                "processor_config.json with an image_processor: processor.save_pretrained(path))"
            )
        tok = _tokenizer(path, local, chat_template)
    return {"architecture": arch, "parameters": parameters, "vocab_size": len(tok)}


def _has_head(path: str, arch: str, config: Any, tensors: set[str]) -> None:
    """An untied model's output embedding (``lm_head.weight``) must be among the weights: transformers would
    otherwise start it at random values and the run would train it from there, silently."""
    text = config.get_text_config()
    if getattr(config, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False):
        return
    head = head_weight(arch, config)
    if head is not None and not any(t == head or t.endswith(f".{head}") for t in tensors):
        raise ModelFolderError(
            f"model.path {path}: config.json has untied embeddings (tie_word_embeddings=false) but the "
            f"weights hold no {head}: the LM head would start at random values; re-save the model with "
            "save_pretrained"
        )


def _has_image_processor(local: Path, files: dict[str, int]) -> bool:
    """The image processor's settings: their own file (transformers 4) or inside processor_config.json (5)."""
    if "preprocessor_config.json" in files:
        return True
    if "processor_config.json" not in files:
        return False
    try:
        return "image_processor" in json.loads((local / "processor_config.json").read_text())
    except (OSError, ValueError):
        return False


def check_stored_base(path: str, store: Any, base_id: str) -> None:
    """Refuse a folder that no longer holds what the shared base model (``_base/<hash>``, keyed by the
    config, i.e. by the path) was built from: a new run would otherwise start from the old model."""
    import hashlib

    m = store.read_manifest(store.stage_uri(base_id, 0, "init"))
    if m is None:
        return
    with tempfile.TemporaryDirectory() as d:
        local = fetch_policy_folder(path, d)
        now = {}
        for f in sorted(local.iterdir()):
            with open(f, "rb") as fh:
                now[f.name] = hashlib.file_digest(fh, "sha256").hexdigest()
    if now != m.outputs["checkpoint"].files:
        raise ModelFolderError(
            f"model.path {path}: the folder changed since the base model {store.run_uri(base_id)} was built "
            "from it; save the new model under another path (or delete that base folder)"
        )


def check_model_section(cfg: Any, rollout_engine: str | None = None) -> dict[str, Any] | None:
    """``check_policy_folder`` for a run's config (None when the run builds its own tiny policy), for the
    rollout engine the run's placement chose (``rollout_engine``; None: ``rollout.engine`` as set)."""
    if not cfg.model.path:
        return None
    vllm = (rollout_engine or cfg.rollout.engine) == "vllm"
    return check_policy_folder(
        cfg.model.path, chat_template=cfg.model.chat_template, max_model_len=cfg.model.max_position, vllm=vllm
    )
