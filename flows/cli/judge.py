"""``judge train``: build and fine-tune a tiny LLM judge for a config's task, labelled by the task's verifier
(``rl_core.scoring.judge_train``), saved as a Hugging Face folder for ``reward.judge.model``.

    rlfoundry judge train --config configs/smoke.yaml --out /tmp/judge --steps 300 --json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import JsonOpt, SetOpt, fail, fresh_out, quiet_stdout

judge_app = typer.Typer(no_args_is_help=True, help="The LLM judge (reward.weights: {judge: w}).")


@judge_app.command("train")
def judge_train(
    config: Annotated[Path, typer.Option("--config", help="Experiment YAML whose task the judge learns.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write the judge to (reward.judge.model).")],
    set_: SetOpt = None,
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 300,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per step.")] = 32,
    lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate (AdamW).")] = 3e-3,
    tasks: Annotated[int, typer.Option(min=1, help="Training tasks the examples come from.")] = 2000,
    as_json: JsonOpt = False,
) -> None:
    """Train a judge on the config's training tasks; prints its held-out agreement with the verifier."""
    from rl_core.schema.config import ConfigError, load_config
    from rl_core.scoring.judge_train import train_judge

    fresh_out(out)  # an existing judge, checkpoint or file is never trained over
    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        fail(str(e))
    try:
        with quiet_stdout():
            report = train_judge(cfg, out, steps=steps, batch_size=batch_size, lr=lr, tasks=tasks)
    except ValueError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(report))
        return
    held = report["heldout"]
    pairwise = held["by_kind"].get("pairwise", float("nan"))
    typer.echo(f"judge written to {out} ({report['parameters']} parameters, {steps} steps)")
    typer.echo(
        f"held-out agreement with the verifier {held['agreement']:.3f} "
        f"(balanced {held['balanced_agreement']:.3f}); pairwise {pairwise:.3f}"
    )
    typer.echo(f"set reward.judge.model={out} and reward.weights.judge=W to use it")


def register(app: typer.Typer) -> None:
    app.add_typer(judge_app, name="judge")
