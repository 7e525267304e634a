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


def _rl_core_imports(path: Path) -> set[str]:
    """The rl_core rooms a module imports (anywhere in it: lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "rl_core" else [f"rl_core.{a.name}" for a in node.names]
        found |= {n.split(".")[1] for n in names if n.startswith("rl_core.")}
    return found


def _rooms() -> dict[str, set[str]]:
    """Each room of rl_core and the rooms its ``__init__`` docstring says it may import ("May import:")."""
    rooms = {}
    for init in sorted((ROOT / "rl_core").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        line = next((x for x in doc.splitlines() if x.startswith("May import:")), None)
        assert line, f"{init.relative_to(ROOT)}: its docstring must say what the room may import"
        rooms[init.parent.name] = {w.strip(" .,") for w in line.removeprefix("May import:").split(",")}
    for room, allowed in rooms.items():
        if allowed == {"every other room"}:
            rooms[room] = set(rooms) - {room}
        elif allowed == {"nothing of rl_core (the schema is the leaf every other room builds on)"}:
            rooms[room] = set()
    return rooms


def test_rl_core_is_rooms_only():
    """Every module of rl_core lives in a room (a subpackage with a docstring); none is left flat."""
    flat = sorted(p.name for p in (ROOT / "rl_core").glob("*.py") if p.name != "__init__.py")
    assert flat == []
    assert set(_rooms()) == {
        "schema", "artifacts", "models", "run", "generation", "training", "scoring", "evaluation", "pipeline"
    }  # fmt: skip


def test_each_room_imports_only_the_rooms_it_declares():
    """The room rules, from the rooms' own docstrings: the schema imports nothing of the library, and no room
    imports one that is not listed — so no import circle runs between files of different rooms."""
    rooms = _rooms()
    assert rooms["schema"] == set() and rooms["pipeline"] == set(rooms) - {"pipeline"}
    broken = {}
    for room in rooms:
        for path in sorted((ROOT / "rl_core" / room).rglob("*.py")):
            extra = _rl_core_imports(path) - rooms[room] - {room}
            if extra:
                broken[str(path.relative_to(ROOT))] = sorted(extra)
    assert broken == {}


def test_the_declared_rooms_form_floors():
    """The rooms' allowances have no cycle (room A may import B and B A), so the rooms stack as floors."""
    rooms = _rooms()
    order: list[str] = []
    while len(order) < len(rooms):
        ready = [r for r in rooms if r not in order and rooms[r] <= set(order)]
        assert ready, f"a cycle among {sorted(set(rooms) - set(order))}"
        order += sorted(ready)
    assert order[0] == "schema" and order[-1] == "pipeline"


def test_the_flat_paths_still_import_for_one_release():
    import importlib
    import warnings

    import rl_core

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("rl_core.config")
        from rl_core.rollout import start_engine
    new = importlib.import_module("rl_core.schema.config")
    assert old is new and old.__spec__.name == "rl_core.schema.config"
    from rl_core.generation.rollout import start_engine as moved

    assert start_engine is moved
    assert any(issubclass(w.category, DeprecationWarning) and "rl_core.schema.config" in str(w.message)
               for w in caught)  # fmt: skip
    # every old flat path leads to a module of a room (modules new since the rooms have no old path)
    rooms = {
        f"rl_core.{p.parent.name}.{p.stem}" for p in (ROOT / "rl_core").glob("*/*.py") if p.stem != "__init__"
    }
    assert set(rl_core.MOVED.values()) <= rooms and len(rl_core.MOVED) >= 57


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
