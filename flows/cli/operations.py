"""Operations: the local stack (``up`` / ``down``, implemented by ``infra.localstack.stack``) and ``serve``,
which registers the deployments (``flows.deployments``) with a Prefect server and executes their runs.

    rlfoundry up                      # S3 (SeaweedFS), Prefect server + UI, MLflow server + UI on 127.0.0.1
    rlfoundry serve --config configs/smoke.yaml --sweep-cron "*/30 * * * *"
    rlfoundry down
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import fail


def up() -> None:
    """Start the local stack on 127.0.0.1: S3 (SeaweedFS), Prefect server + UI, MLflow server + UI."""
    from infra.localstack.process import ServerError
    from infra.localstack.stack import BUCKET, stack_dir
    from infra.localstack.stack import up as start

    try:
        svc = start()["services"]
    except ServerError as e:
        fail(str(e))
    creds = stack_dir() / "credentials.json"
    typer.echo(f"S3       {svc['s3']['url']}   bucket {BUCKET}; credentials from the environment or {creds}")
    typer.echo(f"Prefect  {svc['prefect']['url']}")
    typer.echo(f"MLflow   {svc['mlflow']['url']}")
    typer.echo(f"state    {stack_dir()}")
    typer.echo(f"use it:  rlfoundry run configs/default.yaml --set store.uri=s3://{BUCKET}/runs")


def down() -> None:
    """Stop exactly the processes that ``rlfoundry up`` started (their data stays in the state dir)."""
    from infra.localstack.stack import down as stop

    stopped = stop()
    if not stopped:
        typer.echo("the stack is not up")
    for name, was in stopped.items():
        typer.echo(f"{name:8} {'stopped' if was else 'was not running'}")


def serve(
    config: Annotated[
        Path, typer.Option(help="Experiment YAML whose values are the experiment form's defaults.")
    ] = Path("configs/default.yaml"),
    sweep_run: Annotated[
        list[str] | None,
        typer.Option("--sweep-run", help="Run for the evaluation sweep (repeatable; none = all)."),
    ] = None,
    sweep_cron: Annotated[str, typer.Option(help="Cron schedule of the evaluation sweep.")] = "*/30 * * * *",
    store: Annotated[
        str, typer.Option(help="Store root for the sweep and replay (default: the configured one).")
    ] = "",
    limit: Annotated[int, typer.Option(help="Flow runs executed at once (2 cores here: 1).")] = 1,
) -> None:
    """Register the experiment, evaluation-sweep and replay deployments and run them (Ctrl-C stops)."""
    from rl_core.config import ConfigError, load_config
    from rl_core.paths import PROJECT_ROOT, configure_env

    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(str(e))
    configure_env()
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        fail(
            "no Prefect server to register with: start the local stack (rlfoundry up) or set PREFECT_API_URL"
        )
    os.chdir(PROJECT_ROOT)  # deployments' entrypoints are relative to the project root
    from prefect import serve as prefect_serve

    from flows.deployments import deployments

    typer.echo(
        f"Prefect API {api}: deployments experiment/experiment, "
        f"evaluation-sweep/evaluation-sweep ({sweep_cron}), replay/replay"
    )
    deps = deployments(cfg, sweep_runs=sweep_run or [], sweep_cron=sweep_cron, store=store)
    prefect_serve(*deps, limit=limit, print_starting_message=False)


def register(app: typer.Typer) -> None:
    for command in (serve, up, down):
        app.command()(command)
