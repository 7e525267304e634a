"""The docs site (mkdocs.yml, docs/): it builds with ``--strict`` (no broken link or anchor, no page left out
of the navigation), and its generated pages cover what they describe — every field of the configuration
schema, every command of the CLI, every benchmark result file — so they cannot drift. The tutorials on its
pages run in tests/integration/test_tutorial.py. Builds into a temporary folder, starts no process."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

import generated  # noqa: E402  (docs/hooks/generated.py: the MkDocs hook)


def _build(tmp_path: Path, docs: Path | None = None) -> Path:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site = tmp_path / "site"
    overrides = {"site_dir": str(site)} | ({"docs_dir": str(docs)} if docs else {})
    cfg = load_config(str(ROOT / "mkdocs.yml"), **overrides)
    assert cfg.strict  # warnings (broken links, pages not in nav) fail the build
    build(cfg)
    return site


def test_the_site_builds_strictly_with_every_section(tmp_path: Path) -> None:
    site = _build(tmp_path)
    for page in ("index.html", "concepts/resume/index.html", "guides/gpu/index.html",
                 "reference/configuration/index.html", "reference/cli/index.html", "benchmarks/index.html",
                 "development/index.html"):  # fmt: skip
        assert (site / page).is_file(), page
    html = (site / "reference/configuration/index.html").read_text()
    assert "generated:" not in html and "reward_gpu_memory_utilization" in html


@pytest.mark.parametrize(
    "breakage, file",
    [
        ("[the store](no-such-page.md)", "index.md"),  # a link to a page that does not exist
        ("[resume](concepts/resume.md#no-such-anchor)", "index.md"),  # an anchor that does not exist
        (None, "concepts/orphan.md"),  # a page the navigation leaves out
    ],
)
def test_a_broken_link_or_a_lost_page_fails_the_build(tmp_path: Path, breakage: str | None, file: str):
    from mkdocs.exceptions import Abort

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / file
    page.write_text((page.read_text() if page.exists() else "# Orphan\n") + f"\n{breakage or ''}\n")
    with pytest.raises(Abort):
        _build(tmp_path, docs)


def _fields(model: type[BaseModel], path: str = "") -> list[tuple[str, str]]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _fields(ann, f"{path}.{name}" if path else name)
        else:
            out.append((path, name))
    return out


def test_the_configuration_reference_has_every_field_of_the_schema() -> None:
    from rl_core.schema.config import Config

    page = generated.config_reference()
    tables = {}
    for block in ("\n" + page).split("\n## ")[1:]:
        title, body = block.split("\n", 1)
        tables[title.strip("`")] = body
    fields = _fields(Config)
    assert len(fields) > 100
    for section, name in fields:
        assert f"| `{name}` |" in tables[section], f"{section}.{name} missing from the reference"
    # types, defaults, constraints and descriptions as the schema declares them
    assert "| `iterations` | `int` | `50` | >= 1, <= 100000 | Number of RL iterations" in tables["experiment"]
    assert "| `dtype` | `Literal['fp32', 'bf16']` | `\"fp32\"` |" in tables["train"]


def test_the_cli_reference_has_every_command() -> None:
    import typer

    from flows.cli import app

    page = generated.cli_reference()
    root = typer.main.get_command(app)
    ctx = type(root).context_class(root)
    commands = []
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        subs = cmd.list_commands(type(cmd).context_class(cmd)) if hasattr(cmd, "list_commands") else [None]
        commands += [f"rlfoundry {name}" + (f" {s}" if s else "") for s in subs]
    assert {"rlfoundry run", "rlfoundry resume", "rlfoundry replay", "rlfoundry show"} <= set(commands)
    for command in commands:
        assert f"## `{command}`" in page, command
    assert "| `--run-id` | `str` |" in page and "| `CONFIG` | `path` |" in page


def test_the_benchmark_table_has_every_result_file() -> None:
    page = generated.benchmark_table()
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert len(results) > 20
    for path in results:
        assert f"| `benchmarks/results/{path.name}`" in page, path.name
    vs_trl = json.loads((ROOT / "benchmarks/results/vs_trl.json").read_text())
    row = next(line for line in page.splitlines() if "vs_trl.json" in line)
    assert f"{vs_trl['ratio']:.3g}" in row and "2 cores" in row


def test_the_readme_table_against_trl_is_generated_from_its_result_file() -> None:
    """The README's per-step table is ``benchmarks/vs_trl.py --table benchmarks/results/vs_trl.json``."""
    from benchmarks.vs_trl import table

    result = json.loads((ROOT / "benchmarks/results/vs_trl.json").read_text())
    assert table(result) in (ROOT / "README.md").read_text()
    assert set(result["workloads"]) == {"default", "generation", "64x1", "512x1"}
