"""The README's tutorial is a test: the files of "Your model, your environment, your reward" are extracted
from README.md as written (each code block names its file on its first line) into a folder outside the
project, and the YAML is run with ``rlfoundry run`` exactly as the README says (``PYTHONPATH=.``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import cli_env
from tests.model_folders import write_llama_folder

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Your model, your environment, your reward"


def tutorial_files() -> dict[str, str]:
    """{relative path: content} of every code block in the tutorial section whose first line is a comment
    naming a file (``# mytask/__init__.py``)."""
    text = (ROOT / "README.md").read_text()
    assert HEADING in text, "the README lost its tutorial section"
    section = re.split(r"\n#{2,3} ", text.split(HEADING, 1)[1])[0]
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
