"""Where the suite's time goes: the slowest tests and the seconds per module, read from pytest's JUnit XML.

    make test-profile                                   # the reports of the last `make test`
    python .ci/suite_profile.py test-reports/*.xml [--top 30] [--write-durations tests/durations.json]
    python .ci/suite_profile.py --json test-reports/*.xml   # the same figures as one JSON object

`make test` writes one report per phase under test-reports/ (pytest's `--junitxml`; each test's time is its
setup, call and teardown, so a module-scoped fixture counts in the first test that uses it) and prints this
profile at its end, so CI's log shows it. ``--write-durations`` stores the seconds per xdist group
(tests/conftest.py ``group_of``), which the next `make test` reads to start the longest groups first.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_path(classname: str) -> str:
    """JUnit's dotted class name back to the module's path.

    >>> module_path("tests.integration.test_resume"), module_path("tests.unit.test_config.TestClass")
    ('tests/integration/test_resume.py', 'tests/unit/test_config.py')
    >>> module_path("rl_core.pipeline.replay")
    'rl_core/pipeline/replay.py'
    """
    parts = classname.split(".")
    if len(parts) > 1 and parts[0] == "":  # a module in a dot-folder (".ci.suite_profile")
        parts = [f".{parts[1]}", *parts[2:]]
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n]) + ".py"
        if (ROOT / candidate).exists():
            return candidate
    return "/".join(parts) + ".py"


def strip_group(name: str) -> str:
    """A JUnit test name without the ``@group`` suffix xdist's loadgroup gives it: a group is a module path or
    a shared group's name (no ``]``), or a per-test group ``module:name`` (tests/conftest.py ``group_of``).

    >>> strip_group("test_a[x@1]@tests/integration/test_resume.py"), strip_group("test_a[x@1]")
    ('test_a[x@1]', 'test_a[x@1]')
    >>> strip_group("test_b@s3")
    'test_b'
    >>> strip_group("test_s[a@b]@tests/integration/test_benchmarks_smoke.py:test_s[a@b]")
    'test_s[a@b]'
    """
    at = name.find("@")
    while at != -1:
        head, group = name[:at], name[at + 1 :]
        if "]" not in group or group.endswith(f":{head}"):
            return head
        at = name.find("@", at + 1)
    return name


def read_reports(paths: list[Path]) -> list[dict]:
    """Every test case of the reports: module, name, seconds, outcome, phase (the report's file name)."""
    cases = []
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = tag
            cases.append(
                {
                    "module": module_path(case.get("classname", "")),
                    "name": strip_group(case.get("name", "")),
                    "seconds": float(case.get("time") or 0.0),
                    "outcome": outcome,
                    "phase": path.stem,
                }
            )
    return cases


def profile(cases: list[dict], top: int = 30) -> dict:
    per_module: dict[str, list[float]] = defaultdict(list)
    for c in cases:
        per_module[c["module"]].append(c["seconds"])
    modules = sorted(
        ({"module": m, "tests": len(s), "seconds": round(sum(s), 1)} for m, s in per_module.items()),
        key=lambda r: -r["seconds"],
    )
    slowest = sorted(cases, key=lambda c: -c["seconds"])[:top]
    return {
        "tests": len(cases),
        "seconds": round(sum(c["seconds"] for c in cases), 1),
        "outcomes": {
            o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failure", "error", "skipped")
        },
        "slowest": [{**c, "seconds": round(c["seconds"], 1)} for c in slowest],
        "modules": modules,
    }


def group_seconds(cases: list[dict]) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import group_of

    out: dict[str, float] = defaultdict(float)
    for c in cases:
        out[group_of(c["module"], c["name"])] += c["seconds"]
    return {g: round(s, 1) for g, s in sorted(out.items(), key=lambda kv: -kv[1])}


def print_profile(p: dict) -> None:
    print(f"\n== suite profile: {p['tests']} tests, {p['seconds']:.0f} s of test time ({p['outcomes']})")
    print(f"-- the {len(p['slowest'])} slowest tests (setup + call + teardown)")
    for c in p["slowest"]:
        print(f"{c['seconds']:8.1f} s  {c['module']}::{c['name']}")
    print("-- seconds per module")
    for m in p["modules"]:
        print(f"{m['seconds']:8.1f} s  {m['tests']:4d} tests  {m['module']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path, help="JUnit XML files (pytest --junitxml)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    ap.add_argument("--write-durations", type=Path, help="write the seconds per xdist group here")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.exists()]
    if missing:
        print(f"error: no such report: {', '.join(missing)} (run `make test` first)", file=sys.stderr)
        return 2
    cases = read_reports(args.reports)
    p = profile(cases, args.top)
    if args.write_durations:
        args.write_durations.write_text(json.dumps(group_seconds(cases), indent=1) + "\n")
    if args.json:
        print(json.dumps(p))
    else:
        print_profile(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
