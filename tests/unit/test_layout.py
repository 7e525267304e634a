"""The house rules, read from the code itself: who may import whom, and how big a module or function gets."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rl_core", "envs", "tasks", "flows", "infra")
# package -> top-level modules it must never import
FORBIDDEN = {
    "rl_core": {"prefect", "flows", "tasks", "infra"},  # the RL library: no orchestration, no operations
    "envs": {"rl_core", "flows", "tasks", "prefect"},  # environments stand alone (and run in any worker)
    "tasks": {"flows"},  # data flows one way: flows -> tasks -> rl_core
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules(packages=PACKAGES):
    for pkg in packages:
        yield from sorted(p for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_rules(package):
    broken = {str(p.relative_to(ROOT)): sorted(_imports(p) & FORBIDDEN[package]) for p in _modules([package])}
    assert {k: v for k, v in broken.items() if v} == {}


def test_modules_stay_small():
    big = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}


def test_long_functions_say_why():
    """A function over the limit is allowed only when its docstring says why it is long ("Long: ...")."""
    unexplained = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and "Long:" not in (ast.get_docstring(node) or ""):
                    unexplained.append(f"{p.relative_to(ROOT)}:{node.name} ({length} lines)")
    assert unexplained == []
