"""Untrusted code outside a run: ``sandbox exec`` runs one Python file in the sandbox (``envs/sandbox``), and
``score humaneval`` scores a JSONL file of completions against their problems' tests, each in a fresh sandbox.

    rlfoundry sandbox exec prog.py --timeout 5 --memory-mb 256 --json
    rlfoundry score humaneval --completions samples.jsonl --json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import JsonOpt, fail

sandbox_app = typer.Typer(no_args_is_help=True, help="Run untrusted code in the sandbox (envs/sandbox).")
score_app = typer.Typer(no_args_is_help=True, help="Score completions with a verifier.")


@sandbox_app.command("exec")
def sandbox_exec(
    file: Annotated[
        Path, typer.Argument(help="Python program to run (as main.py in the sandbox's workdir).")
    ],
    timeout: Annotated[float, typer.Option("--timeout", help="Wall-clock limit, seconds.")] = 10.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory limit, MiB.")] = 512,
    mode: Annotated[
        str, typer.Option(help="strict (default) or rlimits (no per-run cgroup: weaker).")
    ] = "strict",
    as_json: JsonOpt = False,
) -> None:
    """Run FILE in a fresh sandbox; prints exit code, timeout, stdout, stderr (64 KiB each at most), why it
    stopped."""
    from envs.sandbox import Limits, Sandbox, SandboxUnavailable

    if not (math.isfinite(timeout) and timeout > 0):
        fail(f"--timeout {timeout}: must be a finite number of seconds > 0")
    if memory_mb <= 0:
        fail(f"--memory-mb {memory_mb}: must be > 0")
    try:
        code = file.read_bytes()
    except OSError as e:
        fail(f"cannot read {file}: {e}")
    try:
        sandbox = Sandbox(mode, dedicated=True)  # type: ignore[arg-type]  (this process only runs it)
        result = sandbox.run({"main.py": code}, limits=Limits(timeout_s=timeout, memory_mb=memory_mb))
    except (SandboxUnavailable, ValueError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    typer.echo(
        f"[exit {result.exit_code}, {result.duration_s:.2f}s, stopped: {result.stopped_reason}]", err=True
    )


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The human-eval samples of a JSONL file (blank lines skipped); exits with the file and line of the first
    one that is not an object with string fields ``task_id`` and ``completion``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    except UnicodeDecodeError as e:
        fail(f"{path} is not UTF-8 text (byte {e.start}): a JSONL file of samples is")
    samples = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: not JSON ({e.msg})")
        if not (
            isinstance(s, dict) and isinstance(s.get("task_id"), str) and isinstance(s.get("completion"), str)
        ):
            fail(f"{path}:{n}: each line needs string fields task_id and completion")
        samples.append(s)
    return samples


@score_app.command("humaneval")
def score_humaneval(
    completions: Annotated[
        Path, typer.Option("--completions", help="JSONL of human-eval samples: task_id, completion per line.")
    ],
    workers: Annotated[
        int | None, typer.Option(min=1, help="Sandboxes at once (default: CPU count).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run each completion with its problem's tests in a fresh sandbox; reward 1 only if all pass."""
    from envs.humaneval import score
    from envs.sandbox import SandboxUnavailable

    samples = read_samples(completions)
    try:
        out = score(samples, workers=workers)
    except SandboxUnavailable as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(out))
        return
    for r in out["results"]:
        typer.echo(f"{r['task_id']:<16} {'PASS' if r['passed'] else 'fail'}  {' '.join(r['flags'])}")
    typer.echo(f"pass rate {out['pass_rate']:.3f} ({len(out['results'])} samples)")


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
    app.add_typer(score_app, name="score")
