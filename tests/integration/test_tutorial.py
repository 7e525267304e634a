"""The docs' tutorials are tests: the files of "Your model, your environment, your reward"
(docs/guides/your-model.md) and of "Your checkpoint and your dataset" (docs/guides/dataset.md) are extracted
from the pages as written (each code block names its file on its first line) into a folder outside the
project, and the YAML is run with ``rlfoundry run`` exactly as the page says (``PYTHONPATH=.``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import cli, cli_env, show_json
from tests.model_folders import write_llama_folder, write_qwen3_folder

ROOT = Path(__file__).resolve().parents[2]
HEADING = "# Your model, your environment, your reward"
BOXED = "## Tutorial: your checkpoint and your dataset"
PAGES = {HEADING: "docs/guides/your-model.md", BOXED: "docs/guides/dataset.md"}


def tutorial_files(heading: str = HEADING) -> dict[str, str]:
    """{relative path: content} of every code block in the tutorial section whose first line is a comment
    naming a file (``# mytask/__init__.py``)."""
    text = (ROOT / PAGES[heading]).read_text()
    assert heading in text, f"{PAGES[heading]} lost its tutorial section {heading!r}"
    section = re.split(r"\n#{2,4} ", text.split(heading, 1)[1])[0]  # "# file" lines are in code blocks
    files = {}
    for body in re.findall(r"```(?:python|yaml)\n(.*?)```", section, flags=re.S):
        first = body.splitlines()[0]
        m = re.match(r"# (\S+\.(?:py|yaml))\b", first)
        if m:
            files[m.group(1)] = body
    return files


def test_tutorial_names_its_files():
    files = tutorial_files()
    assert set(files) >= {"mytask/__init__.py", "mytask.yaml"}
    assert "run: PYTHONPATH=. .venv/bin/rlfoundry run mytask.yaml" in files["mytask.yaml"]


@pytest.mark.slow
def test_readme_tutorial_runs(tmp_path):
    work = tmp_path / "work"
    for rel, body in tutorial_files().items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(body)
    write_llama_folder(work / "my-llama")  # the user's checkpoint (no hub here)
    state = tmp_path / "state"
    env = cli_env(state)
    env["PYTHONPATH"] = os.pathsep.join([".", str(ROOT), env.get("PYTHONPATH", "")])
    cli = [sys.executable, "-m", "flows.cli"]
    r = subprocess.run(
        [*cli, "run", "mytask.yaml", "--run-id", "tutorial"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    shown = subprocess.run(
        [*cli, "show", "tutorial", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    data = json.loads(shown.stdout)
    assert data["iterations_committed"] == 3
    base = Path(data["base"]["init"]["artifacts"]["checkpoint"].removeprefix("file://"))
    assert (base / "model.safetensors").read_bytes() == (work / "my-llama" / "model.safetensors").read_bytes()
    for it in data["iterations"]:
        score = it["stages"]["score_rewards"]
        assert score["status"] == "committed"
        m = score["metrics"]
        assert {
            "correct_mean",
            "format_mean",
            "mytask:same_digits_mean",
            "mytask:same_digits_abstained",
        } <= set(m)
        rewards = pd.read_parquet(score["artifacts"]["rewards"].removeprefix("file://"))
        env_results = pd.read_parquet(
            it["stages"]["execute_envs"]["artifacts"]["env_results"].removeprefix("file://")
        )
        # the user's function abstained exactly where the answer was malformed, and said 0/1 elsewhere
        abstained = rewards["mytask:same_digits"].isna()
        assert (abstained == ~env_results["well_formed"]).all()
        assert set(rewards.loc[~abstained, "mytask:same_digits"]) <= {0.0, 1.0}
        assert m["mytask:same_digits_abstained"] == pytest.approx(abstained.mean())
        assert rewards["reward"].notna().all()  # correct and format never abstain


def _problems(pairs: list[tuple[int, int]]) -> str:
    ask = "What is {}+{}? Put the answer in \\boxed{{}}."
    rows = [{"problem": ask.format(a, b), "answer": str(a + b)} for a, b in pairs]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


@pytest.mark.slow
def test_checkpoint_and_dataset_tutorial_runs(tmp_path):
    """The second tutorial (docs/guides/dataset.md): a Qwen3-shaped folder (tied, bf16, 5 shards, ChatML
    with a system turn and an empty think block, two EOS ids) trained on a JSONL file with math-verify, as
    the page says."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rl_core.models.model import INDEX, folder_dtype, is_weight_file, load_tokenizer
    from rl_core.training.train import read_optimizer_file

    files = tutorial_files(BOXED)
    assert set(files) == {"boxed.yaml"}
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "boxed.yaml").write_text(files["boxed.yaml"])
    mine = write_qwen3_folder(work / "my-qwen3")
    (work / "data" / "train.jsonl").write_text(_problems([(a, b) for a in range(20) for b in range(10)]))
    (work / "data" / "test.jsonl").write_text(_problems([(a, b) for a in range(20, 24) for b in range(10)]))
    state = tmp_path / "state"
    env = cli_env(state)
    r = cli(["run", "boxed.yaml", "--run-id", "boxed", "--set", "model.max_shard_size=40KB"], env, cwd=work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    data = show_json(state, "boxed")
    assert data["iterations_committed"] == 2

    # the base checkpoint is the folder byte for byte
    base = _local(data["base"]["init"]["artifacts"]["checkpoint"])
    theirs = sorted(p.name for p in mine.iterdir() if is_weight_file(p.name))
    assert len(theirs) == 6 and INDEX in theirs  # the index and 5 shards
    assert all((base / n).read_bytes() == (mine / n).read_bytes() for n in theirs)

    # every checkpoint written: bf16, tied, sharded as the folder was; the masters beside it in float32
    last = data["iterations"][-1]["stages"]["train"]
    ckpt = _local(last["artifacts"]["checkpoint"])
    shards = sorted(p for p in ckpt.iterdir() if p.name.endswith(".safetensors"))
    index = json.loads((ckpt / INDEX).read_text())
    assert len(shards) >= 2 and set(index["weight_map"].values()) == {p.name for p in shards}
    assert "lm_head.weight" not in index["weight_map"] and folder_dtype(ckpt) == "bfloat16"
    for p in shards:
        with safe_open(str(p), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}, p.name  # noqa: SIM118
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    _, masters = read_optimizer_file(_local(last["artifacts"]["optimizer"]).read_bytes(), "optimizer")
    assert masters is not None and {v.dtype for v in masters.values()} == {torch.float32}
    trained = {k: v.float() for k, v in model.state_dict().items()}
    named = [k for k in masters if k in trained]
    assert all(torch.equal(masters[k].to(torch.bfloat16).float(), trained[k]) for k in named)
    assert any(not torch.equal(masters[k], trained[k]) for k in named)  # really rounded

    # prompts through the model's own template (system turn, user turn, empty think block); both EOS ids stop
    gen = data["iterations"][0]["stages"]["generate"]
    rollouts = pd.read_parquet(_local(gen["artifacts"]["rollouts"]))
    head = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is "
    tail = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    tok = load_tokenizer(mine)
    seen = [tok.decode(list(ids), skip_special_tokens=False) for ids in rollouts["prompt_ids"]]
    assert all(p.startswith(head) and p.endswith(tail) for p in seen), seen[0]
    eos = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    stopped = rollouts[rollouts["finish_reason"] == "stop"]
    assert len(stopped) > 0 and {int(ids[-1]) for ids in stopped["completion_ids"]} <= eos
    envs = data["iterations"][0]["stages"]["execute_envs"]
    outcomes = pd.read_parquet(_local(envs["artifacts"]["env_results"]))
    assert {"correct", "well_formed", "parsed"} <= set(outcomes.columns)
    mismatch = last["metrics"]["logprob_mismatch_mean"]
    print("bf16 folder: rollout/trainer logprob mismatch (mean)", mismatch)
    assert 0 <= mismatch < 0.05  # bf16's rounding of the weights the engine samples from, not a bug's size

    # the train stage rebuilt from the stored bf16 checkpoint + masters is the run's own, bit for bit
    r = cli(["replay", "boxed", "--iteration", "2", "--stage", "train", "--json"], env, cwd=work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["identical"] is True
