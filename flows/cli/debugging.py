"""Finding why a run went wrong: ``compare`` (two runs side by side), ``report`` (one self-contained HTML
page of a run) and ``eval`` (a checkpoint, a run's or a folder, on the evaluation suites, outside any run).

    rlfoundry compare RUN_A RUN_B [--store-b ROOT] [--json]
    rlfoundry report RUN_ID [--out report.html]
    rlfoundry eval RUN_ID --iteration K [--suite NAME ...] [--set ...] [--json]
    rlfoundry eval CHECKPOINT_FOLDER --config CONFIG [--suite NAME ...] [--set ...] [--json]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import (
    JsonOpt,
    RunIdArg,
    SetOpt,
    StoreOpt,
    checked_run_id,
    fail,
    quiet_stdout,
    store_for,
)


def compare(
    run_a: RunIdArg,
    run_b: Annotated[str, typer.Argument(help="The other run's id.", callback=checked_run_id)],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
    store_b: Annotated[
        str | None, typer.Option("--store-b", help="RUN_B's store root (default: RUN_A's).")
    ] = None,
) -> None:
    """Config differences, metrics side by side, the first iteration where rewards differ beyond noise, stage
    times that changed, and the first stage whose outputs differ."""
    from rl_core.pipeline.compare import compare as compare_runs
    from rl_core.pipeline.compare import render
    from rl_core.run.runs import RunError

    sa = store_for(store)
    sb = store_for(store_b) if store_b else sa
    try:
        data = compare_runs(sa, run_a, sb, run_b)
    except RunError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    from rich.console import Console

    Console().print(render(data))


def _report_path(path: Path, store: Any) -> Path:
    """Where ``report`` may write: not a folder, not inside the (local) store, and not an existing file other
    than a report it wrote before (one that starts as every report does, ``REPORT_MARK``)."""
    from rl_core.pipeline.report import REPORT_MARK

    if path.is_dir():
        fail(f"--out {path} is a folder: give the report's file name (e.g. {path / 'report.html'})")
    if store.is_local and path.resolve().is_relative_to(store.real_root):  # the root as the OS resolves it
        fail(f"--out {path} is inside the store {store.root}: write the report elsewhere")
    if path.exists() or path.is_symlink():
        try:
            with path.open("rb") as f:
                ours = f.read(len(REPORT_MARK)) == REPORT_MARK.encode()
        except OSError as e:
            fail(f"--out {path} cannot be read ({e}): not replaced")
        if not ours or path.is_symlink():
            fail(f"--out {path} exists and is not a report of rlfoundry's: not replaced (give another file)")
    return path


def report(
    run_id: RunIdArg,
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write it (default: RUN_ID.html).")
    ] = None,
    per_iteration: Annotated[
        int, typer.Option("-k", min=0, help="Best, worst and random samples per iteration.")
    ] = 3,
    store: StoreOpt = None,
) -> None:
    """One self-contained HTML page of a run (opens offline): reward and accuracy against iteration and wall
    clock, lengths, stage times, alarms on the timeline, and a rollout viewer."""
    from rl_core.pipeline.report import build
    from rl_core.run.runs import RunError

    opened = store_for(store)
    path = _report_path(out or Path(f"{run_id}.html"), opened)
    try:
        page = build(opened, run_id, per_iteration)
    except RunError as e:
        fail(str(e))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    typer.echo(f"report: {path} ({len(page) // 1024} KiB)")


def _is_folder(target: str) -> bool:
    """A checkpoint folder (a local folder, or a URI such as s3://bucket/ckpt) rather than a run id."""
    return "://" in target or Path(target).is_dir()


def _checked_target(target: str, iteration: int | None, config: Path | None) -> bool:
    """Whether ``target`` is a checkpoint folder (else a run id), with the options that kind takes."""
    folder = _is_folder(target)
    if folder and (config is None or iteration is not None):
        fail(
            f"{target} is a checkpoint folder: give --config CONFIG (its task and eval settings), "
            "no --iteration"
        )
    if not folder and ("/" in target or "\\" in target):
        fail(f"{target}: no such folder (a checkpoint folder to evaluate, or a run id)")
    if not folder and (iteration is None or config is not None):
        checked_run_id(target)
        fail(f"{target} is a run id: give --iteration K (0 = its base policy); --config is for a folder")
    return folder


def eval_(
    target: Annotated[
        str,
        typer.Argument(help="A run id, or a checkpoint folder (local or s3://) as Hugging Face saved it."),
    ],
    iteration: Annotated[
        int | None,
        typer.Option("--iteration", min=0, help="A run's policy to measure: its train checkpoint; 0 = base."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="A folder's task, engine and eval settings (an experiment YAML)."),
    ] = None,
    suites: Annotated[
        list[str] | None, typer.Option("--suite", help="Report only this eval.suites entry (repeatable).")
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Evaluate a checkpoint (held-out accuracy, pass@k, mean reward and the eval.suites) into the replay
    area, naming the policy digest measured: a run's (RUN_ID --iteration K, under the run's config) or a
    folder's (FOLDER --config CONFIG); --set adds or changes suites (or anything else)."""
    from rl_core.artifacts.paths import configure_env

    folder = _checked_target(target, iteration, config)
    configure_env()
    from rl_core.artifacts.retries import StoreUnavailable
    from rl_core.artifacts.store import ArtifactError
    from rl_core.pipeline.measure import evaluate_checkpoint, evaluate_folder
    from rl_core.run.runs import RunError
    from rl_core.schema.config import ConfigError
    from tasks.common import replay_hooks

    try:
        with quiet_stdout():
            if folder:
                data = evaluate_folder(store_for(store), target, config, set_, suites, prepare=replay_hooks)
            else:
                data = evaluate_checkpoint(
                    store_for(store), target, iteration, set_, suites, prepare=replay_hooks
                )
    except StoreUnavailable as e:
        fail(str(e), 3)
    except (RunError, ConfigError, ValueError, RuntimeError, ArtifactError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    what = target if folder else f"{target} policy version {iteration}"
    typer.echo(f"{what} ({data['policy_sha256'][:16]}):")
    for key, value in data["metrics"].items():
        typer.echo(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)
    for command in (compare, report):
        app.command()(command)
