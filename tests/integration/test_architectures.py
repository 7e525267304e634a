"""Architectures by shape, each a folder written here, tied or untied as they ship: Qwen2/2.5, Qwen3 (q/k
norm), Llama-3 (rope scaling, grouped-query attention), Mistral. vLLM loads each as the trainer's model
does (the untied view for a tied one) and samples the trainer's distribution before and after new weights
reach it from memory and from a checkpoint folder (tests/arch_probe.py, in a process of its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli_env, run_script

# As they ship: Qwen2.5's and Qwen3's small models and Llama-3.2 tie their embeddings, Mistral does not (an
# untied Qwen2 is the built-in policy every other test runs).
CASES = ("qwen2-tied", "qwen3-tied", "llama3-tied", "mistral-untied")


@pytest.mark.slow
def test_every_architecture_samples_the_trainers_distribution_after_each_sync(tmp_path: Path):
    args = [str(tmp_path), *(c.replace("-", ":", 1) for c in CASES), "llama3:tied-raw"]
    done = run_script("tests/arch_probe.py", args, cli_env(tmp_path / "state"), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    gaps = json.loads(done.stdout.strip().splitlines()[-1])
    # The control: the tied folder given to vLLM as it is (no untied view) samples from a stale output head
    # once new weights arrive from a folder — the view is what keeps a tied model's engine on the policy.
    assert gaps.pop("llama3-tied-raw")["folder_sync"] > 1e-2
    assert set(gaps) == set(CASES)
    for name, g in gaps.items():
        assert set(g) == {"start", "memory_sync", "folder_sync"}
        assert max(g.values()) < 1e-4, (name, g)  # fp32 rounding; a stale head is tens of nats off
