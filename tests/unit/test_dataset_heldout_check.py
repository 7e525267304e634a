"""The dataset environment's held-out file check (envs/dataset.py): a held-out row that is a training row up
to whitespace and case (a trailing newline, a double space) is refused like an identical one, and so is a row
the held-out file repeats (it would be scored twice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.base import make_env
from rl_core.schema.config import ConfigError, load_config

TRAIN = [{"problem": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1)} for i in range(20)]


def _load(tmp_path: Path, heldout: list[dict]):
    paths = {}
    for name, rows in (("train", TRAIN), ("heldout", heldout)):
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = {"train": str(paths["train"]), "heldout": str(paths["heldout"]), "prompt_field": "problem"}
    return load_config(
        None, ["task.env=dataset", f"task.env_args={json.dumps(args)}", "task.heldout_size=10"]
    )


@pytest.mark.parametrize(
    "problem",
    ["What is 3 plus 4?\n", "What is  5 plus 6?", " what is 7 plus 8?", "WHAT IS 9 PLUS\t10?"],
)
def test_a_training_row_up_to_whitespace_and_case_is_refused_as_held_out(tmp_path, problem):
    rows = [{"problem": "What is 100 plus 1?", "answer": "101"}, {"problem": problem, "answer": "0"}]
    with pytest.raises(ConfigError, match=r"heldout\.jsonl: row 1 is also row \d+ of .*train\.jsonl"):
        _load(tmp_path, rows)


@pytest.mark.parametrize("again", ["What is 100 plus 1?", "what is 100 plus 1? "])
def test_a_held_out_row_repeated_is_refused(tmp_path, again):
    rows = [
        {"problem": "What is 100 plus 1?", "answer": "101"},
        {"problem": "What is 200 plus 1?", "answer": "201"},
        {"problem": again, "answer": "101"},
    ]
    with pytest.raises(ConfigError, match=r"heldout\.jsonl: row 2 is also its row 0 \(.*scored once\)"):
        _load(tmp_path, rows)


def test_distinct_held_out_rows_are_kept_as_they_are(tmp_path):
    rows = [
        {"problem": "What is 100 plus 1?\n", "answer": "101"},
        {"problem": "What is 1 plus 3?", "answer": "4"},
    ]
    cfg = _load(tmp_path, rows)
    held = make_env(cfg.task.env, cfg.task.env_args).tasks("heldout", cfg.task, 0)
    assert [t["prompt"] for t in held] == ["What is 100 plus 1?\n", "What is 1 plus 3?"]


def test_a_fraction_split_trains_on_no_held_out_problem_under_another_spelling(tmp_path):
    """``heldout_fraction`` splits by a hash of the prompt as written (a file without such copies splits as it
    did): a copy of a held-out row with a trailing space or another case is not trained on, and a held-out
    problem is kept once (an audit found 23 of 29 held-out rows trained on)."""
    rows = [{"problem": f"Compute {i}*{i}.", "answer": str(i * i)} for i in range(60)]
    copies = [{"problem": f"compute {i}*{i}. ", "answer": str(i * i)} for i in range(60)]
    envs = {}
    for name, data in (("plain", rows), ("copied", rows + copies)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        args = {"train": str(path), "heldout_fraction": 0.2, "prompt_field": "problem"}
        over = ["task.env=dataset", f"task.env_args={json.dumps(args)}", "task.heldout_size=200"]
        cfg = load_config(None, [*over, "task.train_size=200"])
        env = make_env(cfg.task.env, cfg.task.env_args)
        envs[name] = (env.tasks("train", cfg.task, 0), env.tasks("heldout", cfg.task, 0))
    train, heldout = envs["copied"]
    same = [" ".join(t["prompt"].split()).casefold() for t in heldout]
    assert len(same) == len(set(same)) and heldout
    assert not {" ".join(t["prompt"].split()).casefold() for t in train} & set(same)
    plain_train, plain_heldout = envs["plain"]
    assert {t["prompt"] for t in plain_heldout} <= {t["prompt"] for t in heldout}  # where it was
    assert len(plain_train) + len(plain_heldout) == 60
