"""What the ``rlfoundry`` command groups share: the run-id check every run id passes before anything is read
or written, the common options, opening the store, and keeping ``--json`` output on stdout parseable."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with ``code`` (2: bad input, 3: the store is unreachable)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def checked_run_id(value: str | None) -> str | None:
    """Every run id from the command line passes ``check_run_id`` before anything is read or written."""
    if value is None:
        return None
    from rl_core.run.runs import RunIdError, check_run_id

    try:
        return check_run_id(value)
    except RunIdError as e:
        fail(str(e))


RunIdArg = Annotated[str, typer.Argument(help="Run id.", callback=checked_run_id)]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config field: section.field=value (repeatable).")
]
StoreOpt = Annotated[str | None, typer.Option(help="Store root (default: the configured one).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ConfigArg = Annotated[Path, typer.Argument(help="Experiment YAML (see configs/).")]


def fresh_out(path: Path, option: str = "--out") -> Path:
    """``path`` for a command to write a new folder to: refused (one line naming it) when it exists and is
    not an empty folder, so that nothing already there (a checkpoint, a run) is overwritten."""
    if path.is_symlink() or (path.exists() and not (path.is_dir() and not any(path.iterdir()))):
        what = "a folder that is not empty" if path.is_dir() else "a file"
        fail(f"{option} {path} is {what}: give a new (or empty) folder; nothing was written")
    return path


def store_for(run_store: str | None) -> Any:
    """The store at ``run_store`` (checked by ``rl_core.run.context.checked_root``), or the configured one."""
    from rl_core.run.context import open_store
    from rl_core.schema.config import ConfigError, load_config

    try:
        return open_store(load_config(), run_store, "--store")
    except ConfigError as e:
        fail(str(e))


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send everything written to fd 1 (libraries, C extensions, subprocesses) to stderr, so that
    ``--json`` output on stdout stays parseable."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
