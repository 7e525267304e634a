"""Both engines give a completion the same text: the folder's tokenizer's decoding of its tokens, special
tokens kept, the stop token left out (rl_core.generation.sampling.completion_text). vLLM's own text dropped
special tokens: a Qwen3 folder's ``<think>h</think>7`` reached the verifier as ``h7`` from vLLM (scored
wrong) and whole from the HF engine (the answer after the think block: right)."""

from __future__ import annotations

from envs.dataset_verify import final_answer
from rl_core.generation.rollout import HFEngine, Request, SamplingSpec, VLLMEngine
from rl_core.models.model import load_tokenizer, prompt_ids
from rl_core.models.vllm_args import cpu_vllm_args
from tests.model_folders import write_scripted_folder

THINKS = {"\n": "<think>", "<think>": "h", "h": "</think>", "</think>": "7", "7": "<|im_end|>"}


def test_both_engines_keep_the_think_block(tmp_path):
    folder = write_scripted_folder(tmp_path / "q3", THINKS)
    ids = prompt_ids(load_tokenizer(folder), "What is 3+4?", "auto")
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=8)
    hf = HFEngine(folder)
    vllm = VLLMEngine(
        folder, dtype="float32", max_model_len=128, device_args=cpu_vllm_args(128, 64), multiprocess=False
    )
    try:
        for engine in (hf, vllm):
            comps = engine.generate([Request(ids, seed=3)], spec)[0]
            for c in comps:
                assert c.finish_reason == "stop" and len(c.token_ids) == 5, (type(engine).__name__, c)
                assert c.text == "<think>h</think>7", (type(engine).__name__, c.text)
                assert final_answer(c.text) == "7"
    finally:
        vllm.close()
