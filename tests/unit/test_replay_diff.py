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
