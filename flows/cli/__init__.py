"""The ``rlfoundry`` command line (stable: scripts and checks depend on it), one module per command group.

    rlfoundry run configs/default.yaml --set train.lr=1e-4
    rlfoundry show RUN_ID --json
    python -m flows.cli --help        # the same program

- ``experiment``: ``run``, ``resume`` and the progress display.
- ``inspection``: ``show``, ``replay``, ``rollouts``, ``lineage``.
- ``debugging``: ``compare`` (two runs side by side) and ``report`` (a run as one HTML page).
- ``operations``: ``up``, ``down`` (the local stack, ``infra.localstack``) and ``serve`` (the deployments).
- ``sandbox``: ``sandbox exec`` and ``score humaneval``.
- ``judge``: ``judge train`` (a tiny LLM judge for ``reward.judge.model``).
- ``reward_model``: ``reward-model train`` (the served reward model).
- ``common``: the options and helpers they share (run-id check, store, ``--json`` output).

Heavy libraries (torch, vLLM, Prefect, MLflow) are imported inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from flows.cli import debugging, experiment, inspection, judge, operations, reward_model, sandbox


class _Program(typer.Typer):
    """The ``rlfoundry`` program: a corrupt or missing artifact, a bad config or override, or an unreachable
    store, that no command caught ends it with one line naming it (exit 2; 3: the store), not a
    traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            from rl_core.artifacts.retries import StoreUnavailable
            from rl_core.artifacts.store import ArtifactError
            from rl_core.run.runs import RunError
            from rl_core.schema.overrides import ConfigError

            if not isinstance(e, ArtifactError | RunError | StoreUnavailable | ConfigError):
                raise
            head, *rest = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
            typer.echo(f"error: {' '.join([head, '; '.join(rest)]).strip()}", err=True)  # one line
            sys.exit(3 if isinstance(e, StoreUnavailable) else 2)


app = _Program(
    add_completion=False, no_args_is_help=True, help="RL post-training as resumable Prefect workflows."
)


@app.callback()
def _use_stack(ctx: typer.Context) -> None:
    """While ``rlfoundry up`` is running, every command uses its Prefect server and S3 endpoint."""
    if ctx.invoked_subcommand not in ("up", "down"):
        from infra.localstack.stack import apply_env

        apply_env()


for _group in (experiment, inspection, debugging, operations, reward_model, sandbox, judge):
    _group.register(app)


def main() -> None:
    app()
