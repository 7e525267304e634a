"""Replay's comparison is exact: "identical" means bit for bit, down to the last digit of a logprob."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rl_core.artifacts.store import Store
from rl_core.pipeline.replay import diff_artifact, diff_tables


def _rollouts() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "prompt_index": [0, 0, 1],
            "completion_ids": [[5, 6, 2], [7, 2], [9, 9, 9, 2]],
            "logprobs": [[-0.123456789012, -1.5, -0.25], [-2.0, -0.5], [-0.1, -0.2, -0.3, -0.4]],
            "completion_text": ["12", "3", "999"],
        }
    )


def test_a_logprob_changed_by_1e9_is_different(tmp_path):
    store = Store(str(tmp_path))
    a = _rollouts()
    b = _rollouts()
    b.at[0, "logprobs"] = [-0.123456789012 + 1e-9, -1.5, -0.25]
    # what the old repr()-based comparison saw: numpy prints 8 significant digits, the same for both
    assert repr(np.array(a.at[0, "logprobs"])) == repr(np.array(b.at[0, "logprobs"]))
    old = store.write_table(store.root + "/a/rollouts.parquet", a)
    new = store.write_table(store.root + "/b/rollouts.parquet", b)
    d = diff_artifact(store, old, new)
    assert d["identical"] is False
    assert d["columns_changed"] == ["logprobs"] and d["rows_changed"] == 1


def test_equal_tables_are_identical_and_types_count(tmp_path):
    store = Store(str(tmp_path))
    old = store.write_table(store.root + "/a/t.parquet", _rollouts())
    new = store.write_table(store.root + "/b/t.parquet", _rollouts())
    assert diff_artifact(store, old, new)["identical"] is True
    a = store.read_table(old)
    b = a.assign(prompt_index=a["prompt_index"].astype("float64"))  # same numbers, another type
    assert diff_tables(a, b)["columns_changed"] == ["prompt_index"]
    c = a.copy()
    c.at[2, "completion_text"] = "998"
    assert diff_tables(a, c) == {
        "identical": False,
        "rows": 3,
        "rows_changed": 1,
        "columns_changed": ["completion_text"],
    }


def _flip(path, at: int = -8) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_stored_checkpoint_is_named_not_called_identical(tmp_path):
    """replay compared a checkpoint's manifest hashes and read the stored files unchecked: four flipped bytes
    in the stored weights (max_abs_diff 3.4e38) and in its optimizer state came out "identical"."""
    import pytest
    import torch
    from safetensors.torch import save

    from rl_core.artifacts.store import ArtifactError

    store = Store(str(tmp_path))
    files = {
        "model.safetensors": save({"w": torch.arange(64, dtype=torch.float32)}),
        "config.json": b'{"model_type": "qwen2"}',
        "optimizer.safetensors": save({"m": torch.ones(8)}),
    }
    old = store.put_files(files, store.root + "/a/checkpoint")
    new = store.put_files(files, store.root + "/b/checkpoint")
    assert diff_artifact(store, old, new)["identical"] is True
    for name in ("model.safetensors", "optimizer.safetensors", "config.json"):
        stored = tmp_path / "a" / "checkpoint" / name
        good = stored.read_bytes()
        _flip(stored)
        with pytest.raises(ArtifactError, match=f"corrupt: .*a/checkpoint/{name}"):
            diff_artifact(store, old, new)
        stored.write_bytes(good)
    blob = store.write_bytes(store.root + "/a/state.bin", b"x" * 64)  # a single-file artifact
    _flip(tmp_path / "a" / "state.bin")
    with pytest.raises(ArtifactError, match="corrupt: .*state.bin"):
        diff_artifact(store, blob, blob)
