"""Finding why a run went wrong: ``compare`` (two runs side by side), ``report`` (one self-contained HTML
page of a run) and ``eval`` (a checkpoint of a run on the evaluation suites, outside the run).

    rlfoundry compare RUN_A RUN_B [--store-b ROOT] [--json]
    rlfoundry report RUN_ID [--out report.html]
    rlfoundry eval RUN_ID --iteration K [--suite NAME ...] [--set ...] [--json]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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


def report(
    run_id: RunIdArg,
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write it (default: RUN_ID.html).")
    ] = None,
    per_iteration: Annotated[
        int, typer.Option("-k", help="Best, worst and random samples per iteration.")
    ] = 3,
    store: StoreOpt = None,
) -> None:
    """One self-contained HTML page of a run (opens offline): reward and accuracy against iteration and wall
    clock, lengths, stage times, alarms on the timeline, and a rollout viewer."""
    from rl_core.pipeline.report import build
    from rl_core.run.runs import RunError

    try:
        page = build(store_for(store), run_id, per_iteration)
    except RunError as e:
        fail(str(e))
    path = out or Path(f"{run_id}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    typer.echo(f"report: {path} ({len(page) // 1024} KiB)")


def eval_(
    run_id: RunIdArg,
    iteration: Annotated[
        int, typer.Option("--iteration", help="Whose policy: its train checkpoint; 0 = base.")
    ],
    suites: Annotated[
        list[str] | None, typer.Option("--suite", help="Report only this eval.suites entry (repeatable).")
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Evaluate a run's checkpoint (held-out accuracy, pass@k, and the eval.suites) into the replay area,
    naming the policy version and digest measured; --set adds or changes suites (or anything else)."""
    from rl_core.artifacts.paths import configure_env

    configure_env()
    from rl_core.artifacts.store import ArtifactError
    from rl_core.pipeline.replay import evaluate_checkpoint
    from rl_core.run.runs import RunError
    from rl_core.schema.config import ConfigError
    from tasks.common import replay_hooks

    try:
        with quiet_stdout():
            data = evaluate_checkpoint(
                store_for(store), run_id, iteration, set_, suites, prepare=replay_hooks
            )
    except (RunError, ConfigError, ValueError, RuntimeError, ArtifactError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(f"{run_id} policy version {iteration} ({data['policy_sha256'][:16]}):")
    for key, value in data["metrics"].items():
        typer.echo(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)
    for command in (compare, report):
        app.command()(command)
