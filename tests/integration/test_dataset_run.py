"""A run on the user's own dataset file (``task.env: dataset``): asynchronous RL (``rollout.max_staleness=1``)
SIGKILLed twice and resumed, and still every epoch draws each training prompt exactly once (the order is a
function of the seed and the iteration: nothing is lost or repeated across the crashes); the data files are
recorded with the run, and an edited file stops its resume. The environment's rules one by one:
tests/unit/test_dataset_env.py."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from envs.dataset import epoch_order
from tests.conftest import cli, cli_env

TRAIN = [
    {"q": f"{a}+{b}=", "a": str(a + b)}
    for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (4, 5), (6, 3), (8, 0)]
]
HELDOUT = [
    {"q": f"{a}+{b}=", "a": str(a + b)}
    for a, b in [(1, 1), (2, 3), (4, 4), (5, 3), (6, 1), (2, 7), (3, 3), (1, 8), (9, 0), (0, 6)]
]
PER, ITERATIONS = 4, 4  # 8 prompts, 4 per iteration: two whole epochs


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.slow
def test_every_epoch_draws_each_prompt_once_across_two_crashes(tmp_path: Path):
    args = {
        "train": _write(tmp_path / "train.jsonl", TRAIN),
        "heldout": _write(tmp_path / "heldout.jsonl", HELDOUT),
        "prompt_field": "q",
        "answer_field": "a",
        "verifier": "numeric",
    }
    run = ["run", "configs/smoke.yaml", "--run-id", "ds"]
    run += ["--set", "task.env=dataset", "--set", f"task.env_args={json.dumps(args)}"]
    run += ["--set", f"rollout.prompts_per_iteration={PER}", "--set", f"experiment.iterations={ITERATIONS}"]
    run += [
        "--set",
        "rollout.max_staleness=1",
        "--set",
        "rollout.engine=hf",
        "--set",
        "tracking.enabled=false",
    ]
    run += ["--set", f"eval.every={ITERATIONS}"]
    env = cli_env(tmp_path)
    first = cli(run, {**env, "RLFOUNDRY_FAULT": "generate:outputs@2"})
    assert first.returncode == -9, first.stderr[-3000:]
    second = cli(["resume", "ds"], {**env, "RLFOUNDRY_FAULT": "train:outputs@3"})
    assert second.returncode == -9, second.stderr[-3000:]
    last = cli(["resume", "ds"], env)
    assert last.returncode == 0, last.stderr[-3000:]

    store = tmp_path / "store" / "ds"
    drawn = []
    for k in range(1, ITERATIONS + 1):
        df = pd.read_parquet(store / f"iter-{k:04d}" / "generate" / "rollouts.parquet")
        drawn += df.drop_duplicates("prompt_index").sort_values("prompt_index")["task_id"].tolist()
    ids = [f"train-{i:06d}" for i in range(len(TRAIN))]
    epochs = [drawn[: len(TRAIN)], drawn[len(TRAIN) :]]
    assert all(sorted(e) == ids for e in epochs), epochs  # one permutation per epoch, nothing lost
    want = [ids[i] for k in range(1, ITERATIONS + 1) for i in epoch_order(len(TRAIN), PER, k, seed=0)]
    assert drawn == want
    record = json.loads((store / "run.json").read_text())
    assert set(record["data"]) == {args["train"], args["heldout"]}
    init_manifest = next((tmp_path / "store" / "_base").glob("*/iter-0000/init/_manifest.json"))
    init = json.loads(init_manifest.read_text())
    assert init["metrics"]["data_sha256"] == record["data"]  # the base names the files it was built from

    _write(tmp_path / "train.jsonl", [*TRAIN[:-1], {"q": "9+9=", "a": "18"}])
    edited = cli(["resume", "ds", "--set", f"experiment.iterations={ITERATIONS + 1}"], env)
    assert (
        edited.returncode == 2
        and "train.jsonl changed since the run started" in edited.stderr + edited.stdout
    )
