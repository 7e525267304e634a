"""Multi-turn observations as the chat template's turns, token in / token out: the prompt's tokens, the
model's own turn exactly as sampled, then the observation's text as ``rl_core.models.model.observation_text``
reads it off the template — together the very tokens the template gives the whole conversation. No process:
the tokenizers of tests/model_folders.py (Qwen3's ChatML with a system turn and an empty think block; a
Mistral-style template)."""

from __future__ import annotations

import pytest

from rl_core.models.model import observation_text, prompt_ids
from tests.model_folders import build_qwen3_tokenizer, build_tokenizer


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("which", ["qwen3", "mistral"])
def test_prompt_turn_and_observation_are_the_templates_conversation(which: str):
    tok = build_qwen3_tokenizer() if which == "qwen3" else build_tokenizer()
    question, answer, observation = "what is 2+3", "5", "wrong: try again"
    sampled = _ids(tok, answer) + [tok.eos_token_id]  # the model's turn, ended on its EOS
    stream = prompt_ids(tok, question, "auto") + sampled
    stream += _ids(tok, observation_text(tok, observation, tok.eos_token))
    chat = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": observation},
    ]
    want = _ids(tok, tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    if which == "qwen3":  # the template re-renders the assistant turn without the think block it opened
        think = _ids(tok, "<think>\n\n</think>\n\n")
        i = len(prompt_ids(tok, question, "auto")) - len(think)
        want = want[:i] + think + want[i:]
    assert stream == want


def test_a_turn_cut_at_max_tokens_is_closed_by_the_template():
    tok = build_qwen3_tokenizer()
    text = observation_text(tok, "go on", ended_with=None)
    assert text.startswith("<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")
    # stopped on the other EOS id (<|endoftext|>): the template's own turn end still follows it
    assert observation_text(tok, "go on", "<|endoftext|>") == text


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok = build_qwen3_tokenizer()
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="renders the earlier turns anew"):
        observation_text(tok, "x", None)
