"""``reward-model train``: build and train the reward model of a config's task
(``rl_core/scoring/reward_model.py``) and save it as a Hugging Face folder that ``rlfoundry up
--reward-server`` or a run (``reward.model.path``) serves.

    rlfoundry reward-model train --config configs/smoke.yaml --out runs/rm --json
    rlfoundry up --reward-server runs/rm
    rlfoundry run configs/smoke.yaml --set 'reward.weights={correct: 1.0, reward_model: 0.1}' \\
        --set reward.model.path=runs/rm
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import JsonOpt, SetOpt, fail, fresh_out

reward_model_app = typer.Typer(
    no_args_is_help=True, help="The served reward model (rl_core/scoring/reward_model.py)."
)


@reward_model_app.command("train")
def train(
    out: Annotated[Path, typer.Option(help="Folder to write the reward model to (a Hugging Face folder).")],
    config: Annotated[
        Path, typer.Option(help="Config whose task, model sizes, seed and reward.model settings it uses.")
    ] = Path("configs/default.yaml"),
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train a reward model on preference pairs from the config's task (answer vs a wrong answer); prints its
    held-out pairwise accuracy."""
    from rl_core.schema.config import ConfigError, load_config
    from rl_core.scoring.reward_model import train_reward_model

    fresh_out(out)  # an existing reward model, checkpoint or file is never trained over
    try:
        cfg = load_config(config, overrides or [])
        metrics = train_reward_model(cfg, out)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"out": str(out), **metrics}))
        return
    typer.echo(
        f"reward model -> {out}: held-out pairwise accuracy {metrics['heldout_pairwise_accuracy']:.3f} "
        f"({metrics['heldout_pairs']:.0f} pairs), train {metrics['train_pairwise_accuracy']:.3f}, "
        f"{metrics['train_s']:.1f} s"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(reward_model_app, name="reward-model")
