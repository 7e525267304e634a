"""Looking into a run: ``show`` (iterations x stages), ``replay`` (re-execute one stage and diff it with the
stored outputs), ``rollouts`` (best, worst and random samples as a table) and ``lineage`` (from a checkpoint
back to what produced it).

    rlfoundry show RUN_ID [--json]
    rlfoundry replay RUN_ID --iteration 1 --stage train [--stage evaluate ...] [--json]
    rlfoundry rollouts RUN_ID --iteration 1 [-k 3] [--json]
    rlfoundry lineage RUN_ID --iteration 2 [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import JsonOpt, RunIdArg, SetOpt, StoreOpt, fail, quiet_stdout, store_for

# ``rollouts``' columns (header, key): the narrow default reads in 80 columns; --wide adds the reward
# components and the environment's outcome.
ROLLOUT_COLUMNS = (
    ("prompt", "prompt"),
    ("completion", "completion_text"),
    ("answer", "answer"),
    ("reward", "reward"),
)
WIDE_COLUMNS = (
    ("image", "image"),
    ("correct", "correct"),
    ("format", "format"),
    ("parsed", "env_parsed"),
    ("finish", "finish_reason"),
)


def stage_name(value: str) -> str:
    """``--stage`` must name a stage of the stage table (``rl_core.pipeline.stages.STAGES``), imported only
    once a value is given (the import loads torch, which ``rlfoundry --help`` must not wait for)."""
    from rl_core.pipeline.stages import STAGES

    if value not in STAGES:
        raise typer.BadParameter(f"{value!r} is not a stage; the stages: {', '.join(STAGES)}")
    return value


def stage_names(values: list[str]) -> list[str]:
    """Every ``--stage`` given (repeatable) passes ``stage_name``."""
    return [stage_name(v) for v in values]


def show(
    run_id: RunIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    stages: Annotated[bool, typer.Option("--stages", help="Add each stage's seconds.")] = False,
    vitals: Annotated[bool, typer.Option("--vitals", help="Add more vital signs (wider).")] = False,
    sha: Annotated[bool, typer.Option("--sha", help="Add each iteration's policy sha256.")] = False,
    store: StoreOpt = None,
) -> None:
    """Per iteration: reward, accuracy, KL, entropy, length, seconds and alarms (80 columns); --json: every
    stage's status, timings, metrics, artifact URIs and the policy sha256. Reads only committed manifests:
    works mid-run, from another terminal."""
    from rl_core.pipeline.show import collect, render
    from rl_core.run.runs import RunError

    try:
        data = collect(store_for(store), run_id)
    except RunError as e:
        fail(str(e))
    if as_json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        # the default table fits 80 columns; the wider views print whole and let the terminal wrap
        wide = stages or vitals or sha
        console = Console(width=max(Console().width, 170)) if wide else Console()
        console.print(render(data, stages=stages, vitals=vitals, sha=sha))


def replay(
    run_id: RunIdArg,
    iteration: Annotated[int, typer.Option("--iteration", help="Iteration number (0 = base evaluation).")],
    stages: Annotated[
        list[str],
        typer.Option(
            "--stage",
            help="Stage to replay (a name from rl_core.pipeline.stages.STAGES; a wrong one lists them). "
            "Repeatable: the stages replay in the order given, in one process, their engines started once.",
            metavar="STAGE",
            callback=stage_names,
        ),
    ],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
    set_: SetOpt = None,
) -> None:
    """Re-execute stages from their stored inputs into a scratch prefix; diff them with the stored outputs.

    One ``--stage``: the JSON report of that stage. Several: ``{"identical", "stages": {name: report}}``.
    Exit 0 when every replayed output is identical, 1 when one differs.

    With ``--set``: a what-if. The stages re-run under the changed config (a later stage reads what an
    earlier one re-made) into the replay area, never the run; prints what moved (rewards, advantages,
    metrics). Exit 0."""
    from rl_core.artifacts.paths import configure_env

    configure_env()
    if set_:
        _what_if(run_id, iteration, stages, set_, as_json, store)
        return
    from rl_core.artifacts.store import ArtifactError
    from rl_core.pipeline.replay import replay_stages
    from rl_core.run.runs import RunError
    from tasks.common import replay_hooks

    try:
        with quiet_stdout():
            both = replay_stages(store_for(store), run_id, iteration, stages, prepare=replay_hooks)
    except (RunError, FileNotFoundError, ValueError, ArtifactError) as e:
        fail(str(e))
    reports = both["stages"]
    if as_json:
        typer.echo(json.dumps(next(iter(reports.values())) if len(reports) == 1 else both, indent=1))
    else:
        for stage, report in reports.items():
            verdict = "identical" if report["identical"] else "DIFFERENT"
            typer.echo(f"{run_id} iteration {iteration} {stage}: {verdict}")
            for name, a in report["artifacts"].items():
                brief = {k: v for k, v in a.items() if k not in ("stored", "replayed")}
                typer.echo(f"  {name}: {json.dumps(brief)}")
    raise typer.Exit(0 if both["identical"] else 1)


def _what_if(
    run_id: str, iteration: int, stages: list[str], sets: list[str], as_json: bool, store: str | None
) -> None:
    from rl_core.artifacts.store import ArtifactError
    from rl_core.pipeline.replay import what_if
    from rl_core.run.runs import RunError
    from rl_core.schema.config import ConfigError
    from tasks.common import replay_hooks

    try:
        with quiet_stdout():
            data = what_if(store_for(store), run_id, iteration, stages, sets, prepare=replay_hooks)
    except (RunError, ConfigError, FileNotFoundError, ValueError, ArtifactError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(f"what if {' '.join(sets)}: {run_id} iteration {iteration} (the run is not touched)")
    for stage, rep in data["stages"].items():
        typer.echo(f"{stage}:")
        for key, (before, after) in rep["metrics_changed"].items():
            typer.echo(f"  {key}: {before} -> {after}")
        for key, value in (rep.get("rewards", {}) | rep.get("update", {})).items():
            typer.echo(f"  {key}: {' -> '.join(map(str, value)) if isinstance(value, list) else value}")
        typer.echo(f"  outputs: {', '.join(rep['outputs'].values())}")


def rollouts(
    run_id: RunIdArg,
    iteration: Annotated[int, typer.Option("--iteration", help="Iteration number.")],
    k: Annotated[int, typer.Option("-k", min=0, help="How many best, worst and random samples.")] = 3,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
    images: Annotated[
        Path | None, typer.Option(help="Write multimodal samples' images here as PNG files.")
    ] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Add reward components and env outcome.")] = False,
) -> None:
    """Best, worst and random samples of an iteration: prompt, completion, reward components, env outcome."""
    from rl_core.pipeline.inspect_run import samples

    try:
        data = samples(store_for(store), run_id, iteration, k, image_dir=images)
    except FileNotFoundError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(data, indent=1, default=str))
        return
    from rich.console import Console

    for name, rows in data.items():
        Console().print(_table(f"{run_id} iteration {iteration}: {name}", rows, wide))


def _table(title: str, rows: list[dict[str, Any]], wide: bool = False) -> Any:
    """A rich table of ``rows`` with the columns they have: text columns wrap, nothing is cut."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    cols = [(h, k) for h, k in (*ROLLOUT_COLUMNS, *(WIDE_COLUMNS if wide else ())) if rows and k in rows[0]]
    for header, key in cols:
        numeric = isinstance(rows[0][key], int | float)
        t.add_column(header, overflow="fold", justify="right" if numeric else "left", min_width=len(header))
    for r in rows:
        t.add_row(*[f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for _, k in cols])
    return t


def lineage(
    run_id: RunIdArg,
    iteration: Annotated[
        int, typer.Option("--iteration", help="Iteration whose checkpoint to walk back from.")
    ],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Walk back from a checkpoint to the rollouts, rewards and parent checkpoints that produced it."""
    from rl_core.pipeline.inspect_run import lineage as walk

    try:
        chain = walk(store_for(store), run_id, iteration)
    except FileNotFoundError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(chain, indent=1))
        return
    for link in chain:
        typer.echo(f"iter {link['iteration']:4d}  policy {link['policy_sha256'][:16]}  {link['checkpoint']}")
        for key in ("rollouts", "env_results", "rewards", "optimizer_state"):
            if link.get(key):
                typer.echo(f"           {key:<15} {link[key]}")
        typer.echo(f"           {'parent':<15} {link['parent_checkpoint']}")


def register(app: typer.Typer) -> None:
    for command in (replay, rollouts, lineage, show):
        app.command()(command)
