"""One rule for run ids (rl_core.run.runs.check_run_id) and the store's own naming: nothing outside the root.
(The CLI, the deployments and an s3:// store: tests/integration/test_run_ids.py.)"""

from __future__ import annotations

import pytest

from rl_core.artifacts.store import ArtifactError, Store
from rl_core.run.runs import RESERVED, RunIdError, check_run_id

BAD = [
    "../escape-x",
    "..",
    ".",
    "a/b",
    "/abs",
    "a\\b",
    " spaced",
    "trailing ",
    "x;rm -rf y",
    "$(id)",
    "a..b",
    "",
    "-dash-first",
    ".hidden",
    "new\nline",
    "nul\0",
    "é",
    "x" * 65,
    *sorted(RESERVED),
]
GOOD = ["20261130-180000-abc123", "exp1", "A.b_c-9", "x" * 64]


@pytest.mark.parametrize("bad", BAD)
def test_bad_run_ids_are_refused_with_the_rule(bad):
    with pytest.raises(RunIdError, match=r"invalid run id .*letters, digits.*reserved names \(_base"):
        check_run_id(bad)


@pytest.mark.parametrize("good", GOOD)
def test_good_run_ids_pass_unchanged(good):
    assert check_run_id(good) == good


@pytest.mark.parametrize("prefix", ["..", "a/../..", "a//b", "./a", "a/.", "..\\x"])
def test_store_never_names_a_folder_outside_its_root(tmp_path, prefix):
    store = Store(str(tmp_path / "store"))
    with pytest.raises(ArtifactError, match="would leave the store"):
        store.stage_uri(prefix, 1, "generate")
    assert store.run_uri("_base/0123abcd").endswith("/store/_base/0123abcd")  # the store's own prefixes
