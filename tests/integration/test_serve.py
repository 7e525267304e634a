"""`rlfoundry serve`: the experiment, evaluation-sweep and replay deployments, triggered through Prefect's API
and, for the experiment, through the Prefect UI in headless Chromium."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from rl_core.schema.config import load_config
from tests.conftest import cli_env, prefect_api_call, quiet_cron, serving

# Prefect 3.7's background task mark_deployments_ready, fired by a serving runner's heartbeat, fails at
# once on its SQLite database ("database is locked" within ~30 ms, whatever the timeout): a Prefect bug,
# not ours; every other server error still fails these tests.
pytestmark = pytest.mark.server_log_allows(r"mark_deployments_ready|database is locked")

ROOT = Path(__file__).resolve().parents[2]
CRON = quiet_cron()  # fires 12 hours from now: never while the suite runs


def _wait(api, flow_run_id, timeout_s=900):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fr = prefect_api_call(f"{api}/flow_runs/{flow_run_id}")
        if fr["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return fr
        time.sleep(2)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout_s} s: {fr['state']}")


def _artifact(api, flow_run_id, key):
    arts = prefect_api_call(
        f"{api}/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": [key]}}},
    )
    assert arts, f"no {key} artifact on flow run {flow_run_id}"
    return arts[0]["data"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = tmp_path_factory.mktemp("serve")
    env = cli_env(state)
    api = env["PREFECT_API_URL"]
    with serving(
        state, ["--config", "configs/smoke.yaml", "--sweep-cron", CRON], state / "serve.log"
    ) as deps:
        yield {"api": api, "deps": deps, "state": state, "env": env}


def _run(served, name, parameters, run_name=None):
    dep = served["deps"][name]
    fr = prefect_api_call(
        f"{served['api']}/deployments/{dep['id']}/create_flow_run",
        {"parameters": parameters, **({"name": run_name} if run_name else {})},
    )
    return _wait(served["api"], fr["id"])


@pytest.mark.slow
def test_deployments_triggered_through_the_api(served):
    api, deps, state = served["api"], served["deps"], served["state"]
    # the experiment's parameters are the pydantic config: a form with defaults (the served file) and
    # descriptions
    exp = deps["experiment"]
    schema = exp["parameter_openapi_schema"]
    assert (
        "RL iterations"
        in schema["definitions"]["ExperimentSection"]["properties"]["iterations"]["description"]
    )
    assert "resumes" in schema["properties"]["run_id"]["description"]
    assert exp["parameters"]["config"] == load_config("configs/smoke.yaml").model_dump(mode="json")
    sweep = deps["evaluation-sweep"]
    assert [s["schedule"]["cron"] for s in sweep["schedules"]] == [CRON]

    # evaluate only at the last iteration, so iteration 1's checkpoint has no evaluation; the HF engine (it
    # starts in a second: the UI test below runs the served vLLM engine)
    cfg = load_config("configs/smoke.yaml", ["eval.every=5", "rollout.engine=hf"]).model_dump(mode="json")
    fr = _run(served, "experiment", {"config": cfg, "run_id": "api1"})
    assert fr["state"]["type"] == "COMPLETED", fr["state"]
    assert "api1" in _artifact(api, fr["id"], "experiment-result")
    store = state / "store" / "api1"
    assert (store / "iter-0002" / "evaluate" / "_manifest.json").exists()
    assert not (store / "iter-0001" / "evaluate").exists()

    fr = _run(served, "evaluation-sweep", {"run_ids": ["api1"]})
    assert fr["state"]["type"] == "COMPLETED", fr["state"]
    table = _artifact(api, fr["id"], "evaluation-sweep")
    assert "| api1 | 1 |" in table and "sweep (new)" in table  # the new checkpoint evaluated
    assert "| api1 | 2 |" in table and "| run |" in table  # the one the run evaluated, reused
    swept = store / "sweep" / "iter-0001" / "evaluate" / "_manifest.json"
    first = swept.read_bytes()
    fr = _run(served, "evaluation-sweep", {"run_ids": ["api1"]})  # nothing new: nothing re-evaluated
    assert fr["state"]["type"] == "COMPLETED"
    assert "sweep (reused)" in _artifact(api, fr["id"], "evaluation-sweep")
    assert swept.read_bytes() == first

    fr = _run(served, "replay", {"run_id": "api1", "iteration": 2, "stage": "train"})
    assert fr["state"]["type"] == "COMPLETED", fr["state"]
    assert "**identical**" in _artifact(api, fr["id"], "replay")
    fr = _run(served, "replay", {"run_id": "api1", "iteration": 9, "stage": "train"})
    assert fr["state"]["type"] == "FAILED"
    assert "no committed train stage at iteration 9" in fr["state"]["message"]


# (deployment, parameters, refused by the server's schema check, else the flow fails before any work)
BAD_IDS = [
    ("experiment", {"run_id": "../escape-x"}, True),
    ("experiment", {"run_id": "_base"}, True),
    ("experiment", {"run_id": "a..b"}, False),  # the pattern allows it; the flow's check does not
    ("replay", {"run_id": "a/b", "iteration": 1, "stage": "train"}, True),
    ("replay", {"run_id": "../../x", "iteration": 1, "stage": "train"}, True),
    ("evaluation-sweep", {"run_ids": ["ok", "x;rm -rf y"]}, True),
]


@pytest.mark.slow
def test_deployments_refuse_bad_run_ids(served):
    """Whoever can trigger a run in the UI cannot make the worker write outside the store: a bad id is refused
    when the flow run is created (the typed parameter's pattern) or, at the latest, before the flow body reads
    or writes anything."""
    import urllib.error

    state = served["state"]
    before = sorted(p.relative_to(state) for p in state.rglob("*") if "prefect" not in p.parts)
    for name, params, refused in BAD_IDS:
        dep = served["deps"][name]
        try:
            fr = prefect_api_call(
                f"{served['api']}/deployments/{dep['id']}/create_flow_run", {"parameters": params}
            )
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            assert refused and e.code == 409 and "does not match" in body, (name, params, e.code, body)
            continue
        assert not refused, (name, params, "accepted by the server")
        fr = _wait(served["api"], fr["id"])
        assert fr["state"]["type"] == "FAILED" and "invalid run id" in fr["state"]["message"], (name, fr)
    after = sorted(p.relative_to(state) for p in state.rglob("*") if "prefect" not in p.parts)
    assert after == before
    assert not any(state.parent.glob("escape-x*")) and not (state / "escape-x").exists()


# (a change of the served config the form might send, the field its refusal names)
OFF_POLICY = [
    ({"store": {"uri": "file:///tmp/rlf-elsewhere"}}, "config.store.uri"),
    ({"model": {"path": "/etc"}}, "config.model.path"),
    ({"task": {"env": "os:system"}}, "config.task.env"),
    ({"reward": {"weights": {"correct": 1.0, "subprocess:call": 1.0}}}, "config.reward.weights"),
    ({"tracking": {"mlflow_uri": "http://127.0.0.1:1/x"}}, "config.tracking.mlflow_uri"),
    ({"rollout": {"server_urls": ["http://169.254.169.254/latest"]}}, "config.rollout.server_urls"),
    ({"reward": {"weights": {"correct": 1.0}, "model": {"path": "/root"}}}, "config.reward.model.path"),
]


def _with(change: dict) -> dict:
    cfg = load_config("configs/smoke.yaml").model_dump(mode="json")
    for section, fields in change.items():
        cfg[section] |= fields
    return cfg


@pytest.mark.slow
def test_the_form_is_held_to_the_served_policy(served):
    """The served deployments' policy (flows/form_policy.py) through the REST API: every off-policy value is
    refused when the flow run is created, naming the field; a run created with the schema check turned off
    (``enforce_parameter_schema: false``, which the API lets any caller ask for) fails in the flow, naming
    the field and the rule, before it imports, reads or writes anything."""
    import urllib.error

    state, dep = served["state"], served["deps"]["experiment"]
    url = f"{served['api']}/deployments/{dep['id']}/create_flow_run"
    before = sorted(p.relative_to(state) for p in state.rglob("*") if "prefect" not in p.parts)
    for change, field in OFF_POLICY:
        with pytest.raises(urllib.error.HTTPError) as e:
            prefect_api_call(url, {"parameters": {"config": _with(change), "run_id": ""}})
        body = e.value.read().decode()
        assert e.value.code == 409 and field in body, (change, e.value.code, body[:500])
    for change, field in (OFF_POLICY[1], OFF_POLICY[3]):
        fr = prefect_api_call(
            url, {"parameters": {"config": _with(change), "run_id": ""}, "enforce_parameter_schema": False}
        )
        fr = _wait(served["api"], fr["id"])
        message = fr["state"]["message"]
        assert fr["state"]["type"] == "FAILED" and field in message and "allowed" in message, (
            change,
            message,
        )
    replay = served["deps"]["replay"]
    with pytest.raises(urllib.error.HTTPError) as e:
        prefect_api_call(
            f"{served['api']}/deployments/{replay['id']}/create_flow_run",
            {"parameters": {"run_id": "x", "iteration": 1, "stage": "train", "store": "s3://other/runs"}},
        )
    assert e.value.code == 409 and "store" in e.value.read().decode()
    sweep = served["deps"]["evaluation-sweep"]
    fr = prefect_api_call(
        f"{served['api']}/deployments/{sweep['id']}/create_flow_run",
        {"parameters": {"store": "file:///tmp/rlf-elsewhere"}, "enforce_parameter_schema": False},
    )
    fr = _wait(served["api"], fr["id"])
    assert fr["state"]["type"] == "FAILED" and "not a store this deployment may use" in fr["state"]["message"]
    after = sorted(p.relative_to(state) for p in state.rglob("*") if "prefect" not in p.parts)
    assert after == before and not Path("/tmp/rlf-elsewhere").exists()


@pytest.mark.slow
def test_experiment_started_from_the_prefect_ui(served, chromium_env):
    """Headless Chromium (Debian's) opens the experiment's run form, changes one field, submits, and waits
    until the UI shows the flow run completed."""
    from playwright.sync_api import sync_playwright

    ui = served["api"].removesuffix("/api")
    dep = served["deps"]["experiment"]
    name = f"ui-{secrets.token_hex(3)}"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox"], env=chromium_env
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{ui}/deployments/deployment/{dep['id']}/run", wait_until="networkidle")
            iterations = page.get_by_text("Number of RL iterations").locator("xpath=following::input[1]")
            assert iterations.input_value() == "2"  # the served config's value
            iterations.fill("1")
            page.locator("input[type=text]").first.fill(name)  # the run name
            page.get_by_role("button", name="Submit").click()
            # the submitted run, found by its name through the API (the deployment's run list in the UI
            # refreshes on its own schedule: waiting for its link failed once in a loaded run), then its page
            deadline = time.monotonic() + 120
            flt = {"flow_runs": {"name": {"any_": [name]}}}
            while not (made := prefect_api_call(f"{served['api']}/flow_runs/filter", flt)):
                assert time.monotonic() < deadline, f"the UI's submit created no flow run named {name}"
                time.sleep(1)
            page.goto(f"{ui}/runs/flow-run/{made[0]['id']}", wait_until="commit")
            badge = page.locator(".page-heading-flow-run__meta .state-badge")
            # The badge shows the run's state as the UI read it: some state of a run on its way (on a fast
            # machine it may already be done), then Completed once the worker finished it. The text is the
            # state's *name* (a worker's Pending is named "Submitting", a Scheduled one may be "Late"), so
            # the state's *type* is read from the badge's class, which the UI derives from it.
            badge.first.wait_for(timeout=60_000)
            first_seen = badge.first.get_attribute("class") or ""
            kinds = {c.removeprefix("state--") for c in first_seen.split() if c.startswith("state--")}
            assert kinds and kinds <= {"scheduled", "pending", "running", "completed"}, (
                first_seen,
                badge.first.inner_text(),
            )
            page.locator(".page-heading-flow-run__meta .state-badge.state--completed").wait_for(
                timeout=900_000
            )
            # the run's own log lines on the page the researcher has open (it used to say "Waiting for
            # logs..."): the warm-up status and the iteration line; reloaded, as logs arrive in batches
            page.reload(wait_until="networkidle")
            page.get_by_text("iteration 1: reward").first.wait_for(timeout=60_000)
            page.get_by_text("warm-up steps").first.wait_for(timeout=10_000)
        finally:
            page.screenshot(path=str(served["state"] / "ui.png"), full_page=True)
            print("screenshot:", served["state"] / "ui.png", page.url)
        browser.close()
    runs = prefect_api_call(f"{served['api']}/flow_runs/filter", {"flow_runs": {"name": {"any_": [name]}}})
    assert len(runs) == 1
    assert runs[0]["state"]["type"] == "COMPLETED"
    assert runs[0]["parameters"]["config"]["experiment"]["iterations"] == 1
    # the iteration's vital signs as a table artifact of that flow run, naming its MLflow run
    art = prefect_api_call(
        f"{served['api']}/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [runs[0]["id"]]}, "key": {"any_": ["iteration-0001"]}}},
    )
    assert art and art[0]["type"] == "table" and "MLflow run" in art[0]["description"]
    assert "reward_mean" in art[0]["data"] and "entropy" in art[0]["data"]
