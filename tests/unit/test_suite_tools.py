"""The suite's own tools: the profile CI prints (.ci/suite_profile.py), the grouping and longest-first order
of the two-worker phase (tests/conftest.py), the machine fingerprint pinned hashes are kept with, and the
repeatable ``replay --stage`` refusing a wrong name before anything is read."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from tests.conftest import DEFAULT_GROUP_S, DURATIONS, SPLIT_GROUPS, group_of
from tests.machine import fingerprint

ROOT = Path(__file__).resolve().parents[2]

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.integration.test_resume" name="test_killed_run_resumes[a@1]" time="310.5"/>
<testcase classname="tests.integration.test_resume" name="test_killed_async_run_resumes[b@2]" time="80.0"/>
<testcase classname="tests.unit.test_config" name="test_ok" time="0.25"><skipped message="x"/></testcase>
<testcase classname="tests.unit.test_config" name="test_bad" time="1.5"><failure message="y"/></testcase>
</testsuite></testsuites>
"""


def _profile_module():
    spec = importlib.util.spec_from_file_location("suite_profile", ROOT / ".ci" / "suite_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_sums_modules_ranks_tests_and_writes_group_seconds(tmp_path, capsys):
    prof = _profile_module()
    xml = tmp_path / "parallel.xml"
    xml.write_text(REPORT)
    out = tmp_path / "durations.json"
    assert prof.main([str(xml), "--top", "2", "--json", "--write-durations", str(out)]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert p["tests"] == 4 and p["seconds"] == 392.2
    assert p["outcomes"] == {"passed": 2, "failure": 1, "error": 0, "skipped": 1}
    assert [c["name"] for c in p["slowest"]] == [
        "test_killed_run_resumes[a@1]",
        "test_killed_async_run_resumes[b@2]",
    ]
    assert p["modules"][0] == {"module": "tests/integration/test_resume.py", "tests": 2, "seconds": 390.5}
    assert json.loads(out.read_text()) == {
        "tests/integration/test_resume.py": 310.5,
        "tests/integration/test_resume.py:async": 80.0,
        "tests/unit/test_config.py": 1.8,
    }
    assert prof.main([str(tmp_path / "missing.xml")]) == 2


def test_a_per_test_group_is_recorded_under_the_name_the_schedule_looks_up(tmp_path):
    """xdist names a test ``name@group``; a benchmark smoke's group is ``module:name`` itself: the seconds
    must be stored under that group, not under ``module:name@module:name`` (then every smoke was scheduled at
    the default seconds)."""
    prof = _profile_module()
    smoke = "tests/integration/test_benchmarks_smoke.py"
    name = "test_benchmark_smoke[server_start]"
    xml = tmp_path / "parallel.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="1">'
        f'<testcase classname="tests.integration.test_benchmarks_smoke" name="{name}@{smoke}:{name}" '
        'time="67.5"/></testsuite></testsuites>'
    )
    assert prof.group_seconds(prof.read_reports([xml])) == {group_of(smoke, name): 67.5}


def test_every_recorded_group_is_a_group_the_suite_still_has():
    """tests/durations.json names groups by module path: a renamed or deleted module must leave it, else the
    schedule silently falls back to the default for the new name."""
    seconds = json.loads(DURATIONS.read_text())
    assert seconds and all(s >= 0 for s in seconds.values()) and DEFAULT_GROUP_S > 0
    for group in seconds:
        path, _, name = group.partition(":")
        assert group == "sandbox" or group == "s3" or (ROOT / path).exists(), group
        split = SPLIT_GROUPS.get(path, ("", ""))[1]
        assert "@" not in group and name in ("", split, group_of(path, name).partition(":")[2]), group
    assert group_of("tests/integration/test_stack.py", "test_x") == "s3"


def test_fingerprint_names_the_cpu_and_the_kernels_it_dispatches_on():
    fp = fingerprint()
    assert {"arch", "vendor", "model", "family_model", "isa", "torch_cpu_capability", "torch"} <= set(fp)
    assert fp == fingerprint() and isinstance(fp["isa"], list)


def test_replay_refuses_an_unknown_stage_among_several():
    r = CliRunner().invoke(app, ["replay", "r", "--iteration", "1", "--stage", "train", "--stage", "nope"])
    assert r.exit_code == 2
    assert "'nope' is not a stage" in r.output and "generate" in r.output
