"""The tiny policy: a Qwen2-style causal LM from a transformers config and a BPE tokenizer trained locally.

No hub is needed: the tokenizer is trained with ``tokenizers`` on the task text (digits split one per token),
the model is initialised from a seed, and both are saved as a Hugging Face folder (config, tokenizer,
safetensors) that vLLM and transformers load as is.

    tok = build_tokenizer(texts, vocab_size=64)
    model = build_model(model_cfg, tok, seed=0)
    save_checkpoint(model, tok, "/tmp/ckpt")
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rl_core.models.folder_checks import OTHER_WEIGHTS, check_loaded, completed, folder_eos_ids

EOS = "<|endoftext|>"
PAD = "<|pad|>"
WEIGHTS = "model.safetensors"


def build_tokenizer(texts: Iterable[str], vocab_size: int, extra_special: Sequence[str] = ()) -> Any:
    """Train a BPE tokenizer on ``texts`` (plus special tokens ``extra_special``, e.g. ``<image>``); returns a
    ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    # One token per digit: place value stays visible to the model, which is what makes arithmetic learnable.
    tok.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD, *extra_special], show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(extra_special) or None,
    )
    fast.padding_side = "left"
    return fast


def text_config(model_cfg: Any, tokenizer: Any) -> Any:
    """The Qwen2 config of the policy's language model."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position,
        # Untied: vLLM's in-place weight reload never re-ties a shared LM head (measured: logprobs off by 8).
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def build_model(model_cfg: Any, tokenizer: Any, seed: int) -> Any:
    """A randomly initialised Qwen2ForCausalLM (fp32), deterministic in ``seed``."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = text_config(model_cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float()


def save_checkpoint(model: Any, tokenizer: Any, out_dir: str | Path) -> Path:
    """Save a Hugging Face folder: config.json, generation_config.json, tokenizer files, model.safetensors."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# The output embedding of a causal LM whose config ties it to the input embedding: one tensor in the trainer,
# not stored (save_pretrained leaves it out too; transformers re-ties it on load).
TIED_HEAD, EMBEDDINGS = "lm_head.weight", "model.embed_tokens.weight"


def is_tied(ckpt_dir: str | Path) -> bool:
    """Whether the folder's config ties the output embedding (``lm_head``) to the input embedding."""
    import json

    cfg_file = Path(ckpt_dir) / "config.json"
    if not cfg_file.exists():
        return False
    data = json.loads(cfg_file.read_text())
    text = data.get("text_config") or {}
    return bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


# The dtypes a checkpoint folder may store its weights in; the trainer computes in float32 whatever the folder
# stores (its master weights), the folder keeps its own dtype (``stored_weights``).
STORED_DTYPES = ("float32", "bfloat16", "float16")


def folder_dtype(ckpt_dir: str | Path) -> str:
    """The dtype the folder stores its weights in: config.json's ``dtype`` (``torch_dtype`` before
    transformers 4.56; a vision-language model's text config), float32 when it names none.

    >>> import json, tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    >>> folder_dtype(d), folder_dtype(d / "missing")
    ('bfloat16', 'float32')
    """
    import json

    cfg_file = Path(ckpt_dir) / "config.json"
    if not cfg_file.exists():
        return "float32"
    data = json.loads(cfg_file.read_text())
    text = data.get("text_config") or {}
    found = data.get("dtype") or data.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    dtype = str(found or "float32").removeprefix("torch.")
    if dtype not in STORED_DTYPES:
        raise ValueError(
            f"{cfg_file}: dtype {dtype!r} is not one a checkpoint is trained from here "
            f"(one of {', '.join(STORED_DTYPES)})"
        )
    return dtype


def stored_weights(weights: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The weights as a folder of ``dtype`` stores them: floating tensors cast (rounded to nearest), the rest
    as they are; float32 weights are returned unchanged."""
    if dtype == "float32":
        return weights
    import torch

    to = getattr(torch, dtype)
    return {k: v.to(to) if v.is_floating_point() else v for k, v in weights.items()}


INDEX = "model.safetensors.index.json"  # a sharded folder's map from tensor name to shard file
NO_SHARDS = 1 << 62  # a shard size no model reaches: one file


def is_weight_file(name: str) -> bool:
    """A file that holds (or maps) the weights: ``model.safetensors``, a shard, the shard index, or weights in
    another format (``OTHER_WEIGHTS``: a hub folder's stale ``pytorch_model.bin``, never copied into a
    checkpoint, where ``from_pretrained(use_safetensors=False)`` would load it untrained).

    >>> names = ("model.safetensors", "model-00001-of-00002.safetensors", INDEX, "model.pt", "a.json")
    >>> [is_weight_file(n) for n in names]
    [True, True, True, True, False]
    """
    return (
        name == INDEX
        or (name.startswith("model") and name.endswith(".safetensors"))
        or name.endswith(OTHER_WEIGHTS)
    )


def weights_digest(files: dict[str, str]) -> str:
    """The policy's identity from a checkpoint's file hashes: the sha256 of ``model.safetensors``, or, for a
    sharded folder, of its index and shards (name and sha256 of each, sorted)."""
    import hashlib
    import json

    if WEIGHTS in files:
        return files[WEIGHTS]
    names = sorted(n for n in files if is_weight_file(n) and n.endswith((".safetensors", INDEX)))
    if not names:
        raise KeyError(f"no weight files among {sorted(files)[:8]}")
    return hashlib.sha256(json.dumps([[n, files[n]] for n in names]).encode()).hexdigest()


def weight_files(
    state_dict: dict[str, Any], tied: bool = False, max_shard_bytes: int = NO_SHARDS
) -> dict[str, bytes]:
    """The weights as the files of a checkpoint folder: one ``model.safetensors`` (exactly the bytes it always
    had) up to ``max_shard_bytes``, else shards filled in the state dict's order plus their index, as
    ``save_pretrained(max_shard_size=...)`` writes them. A tied model's output embedding is left out."""
    import json

    from safetensors.torch import save

    tensors = {
        k: v.detach().to("cpu").contiguous() for k, v in state_dict.items() if not (tied and k == TIED_HEAD)
    }
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total <= max_shard_bytes:
        return {WEIGHTS: save(tensors, metadata={"format": "pt"})}
    groups: list[dict[str, Any]] = [{}]
    size = 0
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        if groups[-1] and size + n > max_shard_bytes:
            groups.append({})
            size = 0
        groups[-1][k] = t
        size += n
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    out = {name: save(g, metadata={"format": "pt"}) for name, g in zip(names, groups, strict=True)}
    weight_map = {k: name for name, g in zip(names, groups, strict=True) for k in g}
    out[INDEX] = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    return out


def weights_bytes(state_dict: dict[str, Any], tied: bool = False) -> bytes:
    """The one-file safetensors of a state dict, in memory; a tied model's output embedding left out, as
    ``save_pretrained`` does."""
    return weight_files(state_dict, tied)[WEIGHTS]


def save_weights(state_dict: dict[str, Any], out_dir: str | Path, max_shard_bytes: int = NO_SHARDS) -> Path:
    """Write only the weights (the rest of the checkpoint folder is copied from the parent first: its config
    says whether the embeddings are tied); sharded above ``max_shard_bytes``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in weight_files(state_dict, is_tied(out), max_shard_bytes).items():
        (out / name).write_bytes(data)
    return out


def save_with_weights(
    src: str | Path, state_dict: dict[str, Any], out_dir: str | Path, max_shard_bytes: int = NO_SHARDS
) -> Path:
    """A copy of the checkpoint folder ``src`` (config, tokenizer, processor: every top-level file but the
    weights and hidden ones) whose weights are ``state_dict``."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(src).iterdir()):
        if f.is_file() and not is_weight_file(f.name) and not f.name.startswith("."):
            shutil.copy(f, out / f.name)
    save_weights(state_dict, out, max_shard_bytes)
    return out


def load_model(ckpt_dir: str | Path, workload: Any = None, dtype: str = "float32") -> Any:
    """The checkpoint's model: a causal LM, or a vision-language model (LLaVA) when the folder holds one;
    its weights in ``dtype`` (float32: what a trainer starts from, whatever the folder stores), and with a
    ``workload`` (rl_core.models.placement.Workload) on its device with its attention kernel."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from rl_core.models.vision import is_vlm

    auto = AutoModelForImageTextToText if is_vlm(ckpt_dir) else AutoModelForCausalLM
    extra = {}
    if workload is not None and workload.attn != "sdpa":  # sdpa: transformers' own default
        extra["attn_implementation"] = workload.attn
    model, info = auto.from_pretrained(str(ckpt_dir), torch_dtype=dtype, output_loading_info=True, **extra)
    check_loaded(ckpt_dir, model, info)  # no weight silently left at its random initial value
    if workload is not None and workload.device != "cpu":
        model = model.to(workload.device)
    return model


def load_tokenizer(ckpt_dir: str | Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    # Not AutoTokenizer: for a qwen2 config it builds Qwen2's tokenizer, whose byte-level pre-tokenizer
    # replaces ours and silently drops spaces and newlines that our vocabulary spells as plain characters.
    tok = PreTrainedTokenizerFast.from_pretrained(str(ckpt_dir))
    tok.padding_side = "left"
    return completed(tok, ckpt_dir)  # an EOS and chat template the folder keeps beside the tokenizer


Prompt = str | list[dict[str, Any]]  # a text, or chat messages ({"role": ..., "content": ...})


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, prompt: Prompt) -> str:
    """Chat messages (a text becomes one user message) rendered with the tokenizer's chat template, ending
    where the assistant's answer begins."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    messages = as_template_reads(tokenizer, messages)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


_PROBE = "\ue001"  # a private-use character: no template treats it specially


def as_template_reads(tokenizer: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each text content as a typed part where the template reads typed parts only
    (SmolVLM's and Idefics3's: a plain string's text would vanish from the rendering); else as they are."""
    probe = tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}], tokenize=False)
    if _PROBE in probe:
        return messages
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
        for m in messages
    ]


def uses_chat_template(tokenizer: Any, prompt: Prompt, chat_template: bool | str = "auto") -> bool:
    """Whether ``prompt`` goes through the chat template: chat messages always; a text when
    ``model.chat_template`` is true, or "auto" and the tokenizer has a template."""
    if not isinstance(prompt, str) or chat_template is True:
        if not has_chat_template(tokenizer):
            raise ValueError("the prompt needs a chat template and the tokenizer has none")
        return True
    return chat_template == "auto" and has_chat_template(tokenizer)


def prompt_ids(tokenizer: Any, prompt: Prompt, chat_template: bool | str = "auto") -> list[int]:
    """The token ids the policy is conditioned on for ``prompt`` (generate, warm-up and evaluate alike).

    A rendered chat template already holds its special tokens (BOS, role markers), so nothing is added to it;
    a plain text gets what the tokenizer itself adds (e.g. a BOS; the built-in policy's tokenizer adds
    nothing)."""
    if uses_chat_template(tokenizer, prompt, chat_template):
        return list(tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


# A stand-in for the model's own turn when the template's turn boundaries are read off (a private-use
# character: no template treats it specially).
_TURN_MARK = "\ue000"


def observation_text(tokenizer: Any, observation: Any, ended_with: str | None, role: str = "user") -> str:
    """What follows the model's turn in the token stream when an environment answers it, as the chat
    template renders it: the rest of the model's turn (what the template writes after the turn's end token,
    e.g. ChatML's newline after ``<|im_end|>``; the whole turn end when the model stopped on another token or
    was cut at max_tokens), the observation as the next ``role`` turn, and the opening of the model's next
    turn. ``ended_with``: the text of the stop token the model's turn ended on, None if it did not stop on
    one. The model's own tokens are never re-rendered (token in, token out): only this text is tokenized and
    appended.

    Read off the template with a stand-in conversation, so the answer holds whatever the history; a template
    that renders the earlier turns anew when one is added (nothing to append to) is refused. ``observation``:
    a text, or a list of typed parts (a vision-language turn: ``rl_core.models.vision.image_content``); the
    stand-in turns are typed parts too where the template reads only those (``as_template_reads``).
    """
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN_MARK}]
    turn = {"role": role, "content": observation}
    chat, (turn,) = as_template_reads(tokenizer, chat), as_template_reads(tokenizer, [turn])
    before = tokenizer.apply_chat_template(chat, tokenize=False)
    after = tokenizer.apply_chat_template([*chat, turn], tokenize=False, add_generation_prompt=True)
    if not after.startswith(before) or _TURN_MARK not in before:
        raise ValueError(
            "the chat template renders the earlier turns anew when a turn is added: an observation cannot "
            "be appended to the tokens already sampled"
        )
    turn_end = before[before.rindex(_TURN_MARK) + len(_TURN_MARK) :]
    if ended_with and turn_end.startswith(ended_with):
        turn_end = turn_end[len(ended_with) :]  # the model wrote the turn's end token itself
    return turn_end + after[len(before) :]


def prompt_text(tokenizer: Any, prompt: Prompt) -> str:
    """What a rollout row stores as its prompt: a text as given, chat messages as rendered."""
    return prompt if isinstance(prompt, str) else render_prompt(tokenizer, prompt)


def stop_ids(ckpt_dir: str | Path, tokenizer: Any) -> list[int]:
    """The ids generation stops at: generation_config.json's ``eos_token_id`` (one or a list; without that
    file, config.json's) and the tokenizer's EOS, in that order, without repeats."""
    ids = folder_eos_ids(ckpt_dir)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(int(i) for i in ids))


def pad_id(tokenizer: Any) -> int:
    """The id that fills padding (never attended to, never trained on): the pad token, else the EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path}: no pad token and no EOS token to pad with")
    return int(pad)


def defused(tok: Any, said: str) -> str:
    """``said`` (text the policy may control: a tool's output, an answer shown to a judge) with every special
    token's text broken by a zero-width space, so ``<|im_start|>user`` or ``[/INST]`` in it stays text and
    never becomes a turn of the chat template; text without one is returned as it is (its tokens
    unchanged)."""
    specials = [t for t in getattr(tok, "all_special_tokens", []) if t and t in said]
    added = getattr(tok, "added_tokens_decoder", {}).values()
    specials += [t.content for t in added if t.special and t.content in said]
    for t in sorted(set(specials), key=len, reverse=True):
        said = said.replace(t, t[0] + "\u200b" + t[1:])
    return said
