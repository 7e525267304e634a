"""The debugging walk-through of docs/guides/debugging.md, its commands run as the page writes them: a planted
learning rate that blows up, the KL alarm stopping the run, show, rollouts, report (opened in headless
Chromium), compare against a healthy run, a what-if replay, and resume. Then what the page promises beyond the
printed lines: the alarm in the manifest and MLflow, the stopped-and-resumed run equal to an uninterrupted one
of the same config, and a what-if that never touches the run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import cli, cli_env, show_json

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "debugging.md"
SECTION = "## Walk-through: a learning rate that blows up"


def walkthrough() -> list[tuple[list[str], int]]:
    """(rlfoundry arguments, expected exit code) of every command in the page's walk-through, in order."""
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.strip():
                args = shlex.split(command)
                assert args[0] == "rlfoundry", line
                code = re.search(r"exit (\d+)", comment)
                out.append((args[1:], int(code.group(1)) if code else 0))
    return out


def test_the_walkthrough_is_read_from_the_page():
    commands = walkthrough()
    assert [c[0][0] for c in commands] == [
        "run",
        "show",
        "rollouts",
        "report",
        "run",
        "compare",
        "replay",
        "resume",
    ]
    assert commands[0][1] == 4 and all(code == 0 for _, code in commands[1:])


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The walk-through run in a folder of its own (``report --out bad.html`` lands there); each command's
    result by position."""
    import shutil

    state = tmp_path_factory.mktemp("debugging")
    shutil.copytree(
        ROOT / "configs", state / "configs"
    )  # the page's paths, from a folder outside the checkout
    env = cli_env(state)
    results = []
    for args, code in walkthrough():
        r = cli(args, env, 900, cwd=state)
        assert r.returncode == code, (args, r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        results.append(r)
    return state, results


@pytest.mark.slow
def test_the_alarm_stops_the_run_and_every_view_points_at_it(walked):
    state, (run, show, rollouts, _, _, compare, what_if, _) = walked
    assert "stopped by alarm kl_spike at iteration 2" in run.stdout + run.stderr
    assert "rlfoundry resume bad" in run.stdout + run.stderr
    row = next(line for line in show.stdout.splitlines() if line.strip().startswith("2 "))
    assert row.split()[-1] == "kl_spike" and "iteration 2: kl_spike (stop)" in show.stdout
    assert max(len(line) for line in show.stdout.splitlines()) <= 80
    assert "bad iteration 2: best" in rollouts.stdout and "completion" in rollouts.stdout
    assert "train.lr: 0.0001 -> 0.05" in compare.stdout
    assert "first outputs that differ: train at iteration 1" in compare.stdout
    stored, remade = map(float, re.search(r"max_abs_weight_change: (\S+) -> (\S+)", what_if.stdout).groups())
    assert stored > 100 * remade > 0
    # recorded where the page says: the vitals manifest, kept through the resume, and MLflow
    vitals = json.loads((state / "store" / "bad" / "iter-0002" / "vitals" / "_manifest.json").read_text())
    assert [(a["name"], a["action"]) for a in vitals["metrics"]["alarm_list"]] == [("kl_spike", "stop")]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "attributes.run_name = 'bad/iter-0002'"
    )
    assert runs and runs[0].data.metrics["vitals/alarms"] == 1.0
    # MLflow's own lineage: the update's tables as dataset inputs, its checkpoint a logged model, the finished
    # runs' final policies in the registry
    assert {d.dataset.name for d in runs[0].inputs.dataset_inputs} == {
        "rollouts-iter-0002",
        "rewards-iter-0002",
    }
    models = {m.name for m in client.search_logged_models([runs[0].info.experiment_id])}
    assert {"policy-bad-iter-0001", "policy-bad-iter-0002", "policy-healthy-iter-0002"} <= models
    registered = {v.tags["rlfoundry.run_id"] for v in client.search_model_versions("name='rlfoundry-smoke'")}
    assert registered == {"healthy", "bad"}


@pytest.mark.slow
def test_the_resumed_run_equals_an_uninterrupted_one_and_what_if_left_it_alone(walked):
    state, _ = walked
    shown = show_json(state, "bad")
    assert shown["iterations_committed"] == 3
    # the same config with the alarm only warning, uninterrupted: the same run, output for output
    env = cli_env(state)
    args = ["run", "configs/smoke.yaml", "--run-id", "straight", "--set", "rollout.engine=hf"]
    args += ["--set", "experiment.iterations=3", "--set", "train.kl_coef=0.05", "--set", "train.lr=0.05"]
    r = cli(args, env, 900, cwd=state)
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli(["compare", "bad", "straight", "--json"], env, 300)
    data = json.loads(r.stdout)
    assert data["same_config"] and data["first_output_difference"] is None
    assert [row["a"]["policy_sha256"] == row["b"]["policy_sha256"] for row in data["iterations"]] == [
        True
    ] * 3
    assert all(
        d.startswith("alarms.") for d in data["config_differences"]
    )  # (the resume's --set is recorded)
    # the vitals stage replays bit for bit (it reads only what is stored, timings included)
    r = cli(["replay", "bad", "--iteration", "2", "--stage", "vitals", "--json"], env, 300, cwd=state)
    assert r.returncode == 0 and json.loads(r.stdout)["identical"] is True, r.stdout[-2000:]
    # the what-if wrote under _replay only
    assert any((state / "store" / "_replay" / "bad").glob("what-if-*/iter-0001/train/checkpoint"))
    assert not list((state / "store" / "bad").rglob("*what-if*"))


@pytest.mark.slow
def test_the_report_opens_offline_in_chromium(walked, chromium_env):
    from playwright.sync_api import sync_playwright

    state, _ = walked
    page_file = state / "bad.html"
    assert page_file.exists()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox"], env=chromium_env
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        requests, errors = [], []
        page.on("request", lambda req: requests.append(req.url))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(page_file.as_uri(), wait_until="load")
            figures = page.locator(".fig svg")
            assert figures.count() == 4
            for i in range(4):
                box = figures.nth(i).bounding_box()
                assert box and box["width"] > 300 and box["height"] > 150, (i, box)
            # the alarm on the timeline: drawn into both reward figures, and listed
            assert page.locator("tr.alarm-stop").count() == 1
            assert all("kl_spike" in figures.nth(i).inner_html() for i in (0, 1))
            assert page.locator("details > summary", has_text="iteration").count() == 2  # made when stopped
            first = page.locator("details", has=page.locator("summary", has_text="iteration 1"))
            worst = first.locator("h4", has_text="worst")
            assert not worst.is_visible()  # earlier iterations closed, the last one open
            first.locator("summary").click()
            assert worst.is_visible() and first.locator("tr").count() >= 4
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert errors == []


SUITES = "eval.suites={adds: {filter: {op: [add]}}, subs: {filter: {op: [sub]}}, first4: {size: 4}}"


@pytest.mark.slow
def test_eval_measures_a_named_checkpoint_on_suites_outside_the_run(walked):
    state, _ = walked
    env = cli_env(state)
    before = sorted(p.relative_to(state) for p in (state / "store" / "healthy").rglob("*"))
    r = cli(["eval", "healthy", "--iteration", "2", "--set", SUITES, "--json"], env, 600, cwd=state)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    m = got["metrics"]
    shown = show_json(state, "healthy")
    # the policy it measured, by version and digest: iteration 2's, as show names it
    assert got["policy_version"] == 2 and got["policy_sha256"] == shown["iterations"][1]["policy_sha256"]
    assert m["accuracy"] == shown["iterations"][1]["stages"]["evaluate"]["metrics"]["accuracy"]
    n_add, n_sub = m["suite.adds.problems"], m["suite.subs.problems"]
    assert n_add + n_sub == m["problems"] and m["suite.first4.problems"] == 4  # (smoke: add and sub only)
    weighted = (m["suite.adds.accuracy"] * n_add + m["suite.subs.accuracy"] * n_sub) / m["problems"]
    assert weighted == pytest.approx(m["accuracy"])
    assert m["suite.adds.accuracy"] == m["accuracy_add"]
    # the sampled completions' mean reward, per suite too (every sample is rewarded under smoke's weights)
    assert m["mean_reward"] == shown["iterations"][1]["stages"]["evaluate"]["metrics"]["mean_reward"]
    weighted = (m["suite.adds.mean_reward"] * n_add + m["suite.subs.mean_reward"] * n_sub) / m["problems"]
    assert weighted == pytest.approx(m["mean_reward"])
    # only the suites asked for; a suite the config lacks is refused, naming the ones it has
    r = cli(
        ["eval", "healthy", "--iteration", "0", "--set", SUITES, "--suite", "adds", "--json"],
        env,
        600,
        cwd=state,
    )
    assert r.returncode == 0 and set(json.loads(r.stdout)["metrics"]) == {
        "suite.adds.accuracy", "suite.adds.problems", "suite.adds.pass@1", "suite.adds.pass@4",
        "suite.adds.mean_reward"}  # fmt: skip
    r = cli(["eval", "healthy", "--iteration", "2", "--suite", "nope"], env, 600, cwd=state)
    assert r.returncode == 2 and "--suite nope: not among the config's eval.suites (none)" in r.stderr
    assert sorted(p.relative_to(state) for p in (state / "store" / "healthy").rglob("*")) == before


@pytest.mark.slow
def test_the_sweep_runs_inspect_ai_tasks_against_the_checkpoints(walked, monkeypatch):
    """The evaluation sweep's inspect-ai tasks: the harness in its own environment, against a vLLM server of
    each due checkpoint. A local dataset whose targets are the run's own greedy answers, half of them spoilt:
    the served checkpoint gives the good half again and not the other (includes: 0.5, sample by sample).
    Committed once under the sweep, with the checkpoint's digest; a
    second sweep reuses them."""
    import pandas as pd

    from flows.deployments import _sweep_run
    from rl_core.artifacts.store import Store
    from rl_core.schema.config_eval import InspectTask

    state, _ = walked
    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(state))
    table = pd.read_parquet(state / "store" / "healthy" / "iter-0002" / "evaluate" / "eval.parquet")
    rows = table[table["greedy_completion"].str.len() > 0].head(8)
    spoilt = set(rows["task_id"][1::2])  # '#' is no token of the arithmetic vocabulary: never generated
    lines = [
        {"id": t, "input": p, "target": c + "#" if t in spoilt else c}
        for t, p, c in zip(rows["task_id"], rows["prompt"], rows["greedy_completion"], strict=True)
    ]
    own = state / "own.jsonl"
    own.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tasks = {"own": InspectTask(dataset=str(own), args={"scorer": "includes"}, every=2)}
    store = Store(f"file://{state / 'store'}")
    got = _sweep_run(store, "healthy", tasks)
    assert not any(k.startswith("inspect.") for k in got[1])  # every: 2
    assert got[2]["inspect.own.includes.accuracy"] == 0.5 and got[2]["inspect.own.samples"] == len(lines)
    assert got[2]["inspect.own.api"] == "completions"  # the built-in tokenizer has no chat template
    done = state / "store" / "healthy" / "sweep" / "iter-0002" / "inspect-own"
    from rl_core.models.model import weights_digest

    manifest = json.loads((done / "_manifest.json").read_text())
    measured = weights_digest(manifest["inputs"]["policy"]["files"])
    assert measured == show_json(state, "healthy")["iterations"][1]["policy_sha256"]
    log = json.loads((done / "inspect-log.json").read_text())
    assert log["eval"]["model"] == "openai-api-completions/rlfoundry/policy"
    scored = {s["id"]: s["scores"]["includes"]["value"] for s in log["samples"]}
    assert scored == {t: ("I" if t in spoilt else "C") for t in rows["task_id"]}
    assert _sweep_run(store, "healthy", tasks) == got  # committed: reused, no server started
