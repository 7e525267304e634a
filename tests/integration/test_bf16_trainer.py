"""train.dtype=bf16 on the real DeepSpeed engine (gloo, this CPU): bf16 forwards and gradients, float32
masters in the ZeRO optimizer that are the float32 weights loaded (not a bf16 round trip of them), the
checkpointed weights the masters, and a resumed engine (weights + stored optimizer state) stepping bit for
bit as the uninterrupted one. In its own process (tests/bf16_probe.py): DeepSpeed's process group lives as
long as the process. The same engine on a GPU: infra/gpu_check.sh."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli_env, run_script

pytestmark = pytest.mark.slow


def test_bf16_trainer_keeps_float32_masters_and_resumes_exactly(tmp_path):
    out = run_script("tests/bf16_probe.py", [], cli_env(tmp_path / "state"), timeout=300)  # a fork child
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {"zero1", "zero2"}
    for stage, r in result.items():
        assert r["module_dtypes"] == ["torch.bfloat16"], stage  # DeepSpeed's bf16 mode computes in bf16
        assert r["weights_dtypes"] == ["torch.float32"], stage  # what checkpoints store: the masters
        assert r["bf16_copy_would_differ"], stage  # so the next check can tell a rounded master apart
        assert r["masters_are_the_loaded_fp32"], stage
        assert r["moved"] and r["module_is_masters_rounded"], stage
        assert r["resumed_weights_equal"] and r["resumed_step_equal"], stage
