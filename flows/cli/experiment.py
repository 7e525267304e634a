"""``rlfoundry run`` and ``rlfoundry resume``: start an experiment, or continue one from its last committed
stage, with a progress display (one line per iteration above a bar).

    rlfoundry run configs/default.yaml --set train.lr=1e-4 [--run-id ID] [--curve curve.json]
    rlfoundry resume RUN_ID [--set key=value --force]

Whether the run id may be created or continued is ``rl_core.run.runs.create_or_resume`` (the experiment
deployment uses the same rule). Without PREFECT_API_URL (or ``rlfoundry up``), the run gets a private Prefect
server that dies with it (``infra.localstack.prefect_server.ensure_api``)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from flows.cli.common import ConfigArg, RunIdArg, SetOpt, StoreOpt, checked_run_id, fail, store_for


class Progress:
    """One line per iteration above a progress bar: reward, accuracy and stage timings."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=False, soft_wrap=True)
        self.progress = Progress(
            TextColumn("[bold]RL iterations"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("rl", total=total)
        self.curve: list[dict[str, Any]] = []
        self.alarm_at: dict[str, list[int]] = {}  # alarm name -> the iterations it fired at

    def __call__(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "status":
            self.console.print(f"[dim]{ev['text']}[/]")
            return
        k, t, e = ev["iteration"], ev["timings"], ev.get("eval") or {}
        acc = f"acc {e['accuracy']:.3f}" if e else "         "
        pk = " ".join(f"{m} {v:.2f}" for m, v in e.items() if m.startswith("pass@"))
        if k == 0:
            self.console.print(
                f"[bold]base model[/]  {acc}  {pk}  "
                f"(init {t.get('init', 0):.1f}s, warm-up {t.get('warmup', 0):.1f}s)"
            )
        else:
            times = " ".join(
                f"{s[:3]} {t.get(s, 0):.1f}s"
                for s in ("generate", "execute_envs", "score_rewards", "train", "evaluate")
                if s in t
            )
            self.console.print(f"iter {k:4d}  reward {ev['mean_reward']:.3f}  {acc}  {pk}  [dim]{times}[/]")
            for a in ev.get("alarms", []):
                self._alarm(k, a)
            self.progress.advance(self.task)
        self.curve.append(ev)

    def _alarm(self, k: int, a: dict[str, Any]) -> None:
        """An alarm's line the first time it fires; one line saying it repeats the second time; nothing
        after that (a stop always prints). Every firing is in ``rlfoundry show`` and the summary."""
        seen = self.alarm_at.setdefault(a["name"], [])
        seen.append(k)
        if a["action"] == "stop" or len(seen) == 1:
            colour = "red" if a["action"] == "stop" else "yellow"
            self.console.print(f"[{colour}]  alarm {a['name']} ({a['action']}): {a['message']}[/]")
        elif len(seen) == 2:
            self.console.print(
                f"[yellow]  alarm {a['name']} again (iterations {seen[0]}, {k}): it repeats; not printed "
                "again this run (each iteration's alarms: rlfoundry show)[/]"
            )

    def alarm_summary(self) -> str | None:
        """One line naming each alarm that fired and at which iterations, or None."""
        if not self.alarm_at:
            return None
        parts = []
        for name, ks in sorted(self.alarm_at.items()):
            at = ", ".join(map(str, ks[:8])) + (", ..." if len(ks) > 8 else "")
            parts.append(f"{name} at {len(ks)} iteration{'s' * (len(ks) > 1)} ({at})")
        return "alarms: " + "; ".join(parts)


def run(
    config: ConfigArg,
    set_: SetOpt = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Run id (default: a new one).", callback=checked_run_id)
    ] = None,
    curve: Annotated[Path | None, typer.Option(help="Write the per-iteration curve (JSON) here.")] = None,
) -> None:
    """Start an experiment; prints the run id."""
    from rl_core.schema.config import ConfigError, load_config

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        fail(str(e))
    launch(cfg, run_id, "new", curve=curve)


def resume(
    run_id: RunIdArg,
    set_: SetOpt = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Apply a --set that changes what stages compute, as a new config version from the first "
            "iteration not yet committed (run.json keeps every version; nothing committed is recomputed).",
        ),
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Continue a crashed or stopped run from its last committed stage."""
    from rl_core.run.runs import RunError, run_config
    from rl_core.schema.config import ConfigError, apply_overrides, config_from_dict

    try:
        cfg = run_config(store_for(store), run_id)
        if set_:
            cfg = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), set_), "--set")
    except (RunError, ConfigError) as e:
        fail(str(e))
    launch(cfg, run_id, "resume", force=force)


def launch(
    cfg: Any,
    run_id: str | None,
    mode: Literal["new", "resume"],
    *,
    force: bool = False,
    curve: Path | None = None,
) -> None:
    """Create or resume the run record (``create_or_resume``), then run the experiment flow with progress."""
    from envs.base import EnvUnavailable
    from rl_core.artifacts.retries import StoreUnavailable
    from rl_core.run.context import RunContext
    from rl_core.run.run_lock import holding_run
    from rl_core.run.runs import RunError, create_or_resume, new_run_id
    from rl_core.schema.config import ConfigError

    rid = run_id or new_run_id()
    held = contextlib.ExitStack()  # the run's lock, from before its record is written until the flow ends
    try:  # EnvUnavailable: the environment's browser or tool is missing (refused before any work)
        ctx = RunContext(cfg, rid)
        held.enter_context(holding_run(ctx))
        create_or_resume(ctx, mode, force=force)
    except (RunError, ConfigError, StoreUnavailable, EnvUnavailable) as e:  # ConfigError: a bad model.path
        held.close()
        fail(str(e), 3 if isinstance(e, StoreUnavailable) else 2)
    with held:
        _follow(cfg, rid, ctx, curve)


def _follow(cfg: Any, rid: str, ctx: Any, curve: Path | None) -> None:
    """Run the experiment flow of the created or resumed run ``rid``, with its progress display."""
    from infra.localstack.prefect_server import ensure_api
    from rl_core.artifacts.report import subscribe
    from rl_core.artifacts.retries import StoreUnavailable
    from rl_core.run.runs import run_command

    typer.echo(f"run id: {rid}")
    typer.echo(f"artifacts: {ctx.store.run_uri(rid)}")
    ensure_api()
    from flows.experiment import experiment_flow, with_result_storage
    from flows.observe import AlarmStop, alarms_shown_here
    from rl_core.generation.ray_engines import EngineLost
    from rl_core.training.train_launch import TrainJobError

    prog = Progress(cfg.experiment.iterations)
    t0 = time.time()

    def record(ev: dict[str, Any]) -> None:
        ev["elapsed_s"] = round(time.time() - t0, 2)

    unsubscribe = [subscribe(record), subscribe(prog)]
    alarms_shown_here()  # the progress display prints each alarm: Prefect's console line would repeat it
    try:
        with prog.progress:
            result = with_result_storage(experiment_flow, ctx.store)(cfg, rid)
    except StoreUnavailable as e:
        again = run_command("resume", rid, ctx.store.root)
        fail(f"{e}\nevery committed stage is kept; once the store answers again: {again}", 3)
    except AlarmStop as e:
        fail(str(e), 4)
    except (TrainJobError, EngineLost) as e:  # a rank or engine on a cluster failed: which, where, its log
        first = str(e).splitlines()[0]
        fail(f"{first}\nevery committed stage is kept: {run_command('resume', rid, ctx.store.root)}", 1)
    finally:
        for unsub in unsubscribe:
            unsub()
    if curve:
        curve.parent.mkdir(parents=True, exist_ok=True)
        curve.write_text(
            json.dumps({"run_id": rid, "config": cfg.model_dump(mode="json"), "curve": prog.curve}, indent=1)
        )
    _summary(cfg, rid, ctx.store, result, prog.alarm_summary())


def _summary(cfg: Any, rid: str, store: Any, result: dict[str, Any], alarms: str | None) -> None:
    from infra.localstack.stack import is_up, status
    from rl_core.run.lineage import tracking_uri
    from rl_core.run.runs import run_command

    base, final = result["base_accuracy"], result["final"]["accuracy"]
    typer.echo(
        f"\nrun {rid} finished: held-out accuracy {base:.3f} (base) -> {final:.3f} "
        f"({(final - base) * 100:+.1f} points)"
    )
    if alarms:
        typer.echo(alarms)
    typer.echo(f"artifacts: {store.run_uri(rid)}")
    typer.echo(f"inspect:   {run_command('show', rid, store.root)}")
    stack = status()
    if is_up(stack):
        svc = stack["services"]
        typer.echo(f"MLflow UI: {svc['mlflow']['url']}   Prefect UI: {svc['prefect']['url']}/runs")
    else:
        uri = tracking_uri(cfg)
        typer.echo(f"MLflow UI: .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(resume)
