"""The environments' name table (issue 44, item 6): ``envs/base.py`` imports no environment; a run that names
one imports that module alone; every name in the table resolves to its class (whose ``name`` is the table's);
an unknown name is refused listing the known ones; and no environment module imports another environment
module except the one it builds on."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from envs.base import BUILTIN, env_class, registered

ROOT = Path(__file__).resolve().parents[2]
ENV_MODULES = sorted({target.partition(":")[0] for target in BUILTIN.values()})


def _imported_after(code: str) -> list[str]:
    """The environment modules in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    probe = (
        f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {ENV_MODULES!r} if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_contract_imports_no_environment_and_a_name_imports_its_module_alone():
    assert _imported_after("import envs.base; envs.base.registered()") == []
    assert _imported_after("from envs.base import env_class; env_class('arithmetic')") == ["envs.arithmetic"]
    # shapes builds on arithmetic: its import is the only other one
    assert _imported_after("from envs.base import make_env; make_env('shapes')") == [
        "envs.arithmetic",
        "envs.shapes",
    ]


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_name_resolves_to_its_class(name):
    cls = env_class(name)
    assert f"{cls.__module__}:{cls.__qualname__}" == BUILTIN[name]
    assert cls.name == name
    assert name in registered()


def test_an_unknown_name_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'arithmetik'; known: arithmetic, code,"):
        env_class("arithmetik")


def test_no_environment_module_imports_another_but_the_one_it_builds_on():
    """The old registry imported every environment from ``envs/base.py`` and each imported ``envs.base``: an
    import circle through all of them. What remains is one environment building on another."""
    builds_on = {"envs.countup": {"envs.arithmetic"}, "envs.shapes": {"envs.arithmetic"}}
    for module in ENV_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        imported = {
            n.module
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.ImportFrom) and n.module in ENV_MODULES
        }
        assert imported <= builds_on.get(module, set()), (module, imported)
    base = ast.parse((ROOT / "envs" / "base.py").read_text())
    from_base = {n.module for n in ast.walk(base) if isinstance(n, ast.ImportFrom)}
    assert not from_base & set(ENV_MODULES), from_base
