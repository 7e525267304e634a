"""Operations: the local stack (``up`` / ``down``, implemented by ``infra.localstack.stack``), ``serve``,
which registers the deployments (``flows.deployments``) with a Prefect server and executes their runs in this
process, and ``deploy``, which registers them to a Prefect work pool whose workers execute their runs.

    rlfoundry up                      # S3 (SeaweedFS), Prefect server + UI, MLflow server + UI on 127.0.0.1
    rlfoundry up --reward-server runs/rm   # plus a reward server (rlfoundry reward-model train --out runs/rm)
    rlfoundry serve --config configs/smoke.yaml --sweep-cron "*/30 * * * *"
    rlfoundry deploy --work-pool rlfoundry --config configs/smoke.yaml   # then the worker it prints
    rlfoundry deploy --work-pool rlfoundry-k8s --pool-type kubernetes --set store.uri=s3://BUCKET/runs
    rlfoundry down
"""

from __future__ import annotations

import enum
import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.common import SetOpt, fail

if TYPE_CHECKING:
    from flows.form_policy import FormPolicy
    from rl_core.schema.config import Config


class PoolType(enum.StrEnum):
    process = "process"
    kubernetes = "kubernetes"


ConfigOpt = Annotated[
    Path, typer.Option(help="Experiment YAML whose values are the experiment form's defaults.")
]
SweepRunOpt = Annotated[
    list[str] | None,
    typer.Option("--sweep-run", help="Run for the evaluation sweep (repeatable; none = all)."),
]
SweepCronOpt = Annotated[str, typer.Option(help="Cron schedule of the evaluation sweep.")]
StoreRootOpt = Annotated[
    str, typer.Option(help="Store root for the sweep and replay (default: the configured one).")
]


def _allow(flag: str, what: str) -> object:
    return typer.Option(
        flag, help=f"The Prefect form may also use {what} (repeatable; flows/form_policy.py)."
    )


AllowStoreOpt = Annotated[
    list[str] | None, _allow("--allow-store", "this store.uri (default: the served one)")
]
AllowRootOpt = Annotated[
    list[str] | None, _allow("--allow-root", "model / reward / judge paths under this folder or URL prefix")
]
AllowUrlOpt = Annotated[list[str] | None, _allow("--allow-url", "this rollout / reward / MLflow server URL")]
AllowEnvOpt = Annotated[list[str] | None, _allow("--allow-env", "this task.env (e.g. a module:Class)")]
AllowRewardOpt = Annotated[list[str] | None, _allow("--allow-reward", "this reward.weights key")]
DEFAULT_CONFIG = Path("configs/default.yaml")
DEFAULT_CRON = "*/30 * * * *"


def up(
    rollout_servers: Annotated[
        int,
        typer.Option(
            min=0, max=64, help="Also start N vLLM rollout servers on --model (runs use rollout.server_urls)."
        ),
    ] = 0,
    model: Annotated[
        Path | None,
        typer.Option(help="Checkpoint folder the rollout servers start on (a run syncs its own weights in)."),
    ] = None,
    config: Annotated[
        Path, typer.Option(help="Config whose rollout settings and model length the servers use.")
    ] = DEFAULT_CONFIG,
    reward_server: Annotated[
        Path | None,
        typer.Option(help="Also start a reward server (vLLM pooling) on this reward model folder."),
    ] = None,
) -> None:
    """Start the local stack on 127.0.0.1: S3 (SeaweedFS), Prefect server + UI, MLflow server + UI; with
    --rollout-servers, vLLM rollout servers too; with --reward-server, a reward server (both stopped by
    ``down``)."""
    from infra.localstack.process import ServerError
    from infra.localstack.stack import BUCKET, check_model_folder, stack_dir, start_rollout_servers
    from infra.localstack.stack import up as start

    _check_reward_folder(reward_server)
    cfg = None
    if rollout_servers:
        if model is None:
            fail("--rollout-servers needs --model: a checkpoint folder (e.g. a run's warm-up checkpoint)")
        cfg = _load(config)
        try:
            check_model_folder(model)
        except ServerError as e:
            fail(str(e))
    try:
        svc = start()["services"]
        urls = start_rollout_servers(model, rollout_servers, cfg) if cfg is not None and model else []
        reward_url = _start_reward(reward_server, config) if reward_server is not None else ""
    except ServerError as e:
        fail(str(e))
    creds = stack_dir() / "credentials.json"
    typer.echo(f"S3       {svc['s3']['url']}   bucket {BUCKET}; credentials from the environment or {creds}")
    typer.echo(f"Prefect  {svc['prefect']['url']}")
    typer.echo(f"MLflow   {svc['mlflow']['url']}")
    for i, url in enumerate(urls):
        typer.echo(f"rollout  {url}   vLLM server {i} on {model}")
    typer.echo(f"state    {stack_dir()}")
    typer.echo(f"use it:  rlfoundry run configs/default.yaml --set store.uri=s3://{BUCKET}/runs")
    if urls:
        typer.echo(f"         --set 'rollout.server_urls=[{','.join(urls)}]'   (generate on those servers)")
    if reward_url:
        typer.echo(f"reward   {reward_url}   vLLM pooling server on {reward_server}")
        typer.echo(f"         --set reward.model.url={reward_url} --set reward.model.path={reward_server}")


def _check_reward_folder(folder: Path | None) -> None:
    from infra.localstack.process import ServerError
    from infra.reward_server import check_reward_folder

    try:
        if folder is not None:
            check_reward_folder(folder)
    except ServerError as e:
        fail(str(e))


def _start_reward(folder: Path, config: Path) -> str:
    from infra.localstack.stack import start_reward_server

    return start_reward_server(folder, _load(config).reward.model.kv_cache_mb)


def down() -> None:
    """Stop exactly the processes that ``rlfoundry up`` started (their data stays in the state dir)."""
    from infra.localstack.stack import down as stop

    stopped = stop()
    if not stopped:
        typer.echo("the stack is not up")
    for name, was in stopped.items():
        typer.echo(f"{name:8} {'stopped' if was else 'was not running'}")


def _load(config: Path, overrides: list[str] | None = None) -> Config:
    from rl_core.schema.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        fail(str(e))


def _prepare(config: Path, overrides: list[str] | None = None) -> tuple[Config, str]:
    """The served config and the Prefect API URL as messages show it (without credentials: they are never
    printed), with the project root as the working directory (the deployments' entrypoints are relative to
    it)."""
    from rl_core.artifacts.paths import PROJECT_ROOT, configure_env
    from rl_core.schema.config_secrets import redacted

    cfg = _load(config, overrides)
    configure_env()
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        fail(
            "no Prefect server to register with: start the local stack (rlfoundry up) or set PREFECT_API_URL"
        )
    os.chdir(PROJECT_ROOT)
    return cfg, redacted(api)


def _policy(cfg: Config, store: str, *allowed: list[str] | None) -> FormPolicy:
    from flows.form_policy import FormPolicy

    stores, roots, urls, envs, rewards = allowed
    return FormPolicy.served(
        cfg, store=store, stores=stores, roots=roots, urls=urls, envs=envs, rewards=rewards
    )


def _names(sweep_cron: str) -> str:
    return f"experiment/experiment, evaluation-sweep/evaluation-sweep ({sweep_cron}), replay/replay"


def serve(
    config: ConfigOpt = DEFAULT_CONFIG,
    sweep_run: SweepRunOpt = None,
    sweep_cron: SweepCronOpt = DEFAULT_CRON,
    store: StoreRootOpt = "",
    limit: Annotated[int, typer.Option(help="Flow runs executed at once (2 cores here: 1).")] = 1,
    allow_store: AllowStoreOpt = None,
    allow_root: AllowRootOpt = None,
    allow_url: AllowUrlOpt = None,
    allow_env: AllowEnvOpt = None,
    allow_reward: AllowRewardOpt = None,
) -> None:
    """Register the experiment, evaluation-sweep and replay deployments and run them (Ctrl-C stops). The
    form may set the served store, paths and servers and the registered environments and rewards; the
    --allow-* options add to that."""
    cfg, api = _prepare(config)
    from prefect import serve as prefect_serve

    from flows.deployments import deployments

    policy = _policy(cfg, store, allow_store, allow_root, allow_url, allow_env, allow_reward)
    typer.echo(f"Prefect API {api}: deployments {_names(sweep_cron)}")
    deps = deployments(cfg, sweep_runs=sweep_run or [], sweep_cron=sweep_cron, store=store, policy=policy)
    prefect_serve(*deps, limit=limit, print_starting_message=False)


POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def checked_pool_name(name: str) -> str:
    """``name`` if it can name a work pool (and is a safe word in the printed worker command), else exit 2
    before anything is imported or contacted."""
    if not POOL_NAME.fullmatch(name):
        fail(f"invalid work pool name {name!r}: 1-63 of A-Z a-z 0-9 . _ -, the first a letter or digit")
    return name


def _check_server(api: str) -> None:
    """Fail with exit code 2, naming the URL (without credentials), when no Prefect server answers there."""
    from prefect.client.orchestration import get_client

    from rl_core.schema.config_secrets import redacted

    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        fail(
            f"no Prefect server answers at PREFECT_API_URL={redacted(api)} ({type(problem).__name__}): "
            "start the local stack (rlfoundry up) or fix PREFECT_API_URL"
        )


def deploy(
    work_pool: Annotated[
        str, typer.Option(help="Work pool to register to (created when missing).", callback=checked_pool_name)
    ],
    pool_type: Annotated[
        PoolType, typer.Option(help="Type of the pool when created: process workers, or Kubernetes Jobs.")
    ] = PoolType.process,
    image: Annotated[
        str,
        typer.Option(
            help="Kubernetes pools: the flow runs' image, the project at its workdir (default: infra/k8s's)."
        ),
    ] = "",
    config: ConfigOpt = DEFAULT_CONFIG,
    set_: SetOpt = None,
    sweep_run: SweepRunOpt = None,
    sweep_cron: SweepCronOpt = DEFAULT_CRON,
    store: StoreRootOpt = "",
    allow_store: AllowStoreOpt = None,
    allow_root: AllowRootOpt = None,
    allow_url: AllowUrlOpt = None,
    allow_env: AllowEnvOpt = None,
    allow_reward: AllowRewardOpt = None,
) -> None:
    """Register the experiment, evaluation-sweep and replay deployments to a Prefect work pool, whose
    workers execute their runs; prints the worker to start. The form's policy as for serve."""
    cfg, api = _prepare(config, set_)
    policy = _policy(cfg, store, allow_store, allow_root, allow_url, allow_env, allow_reward)
    _check_server(api)
    from flows.deployments import K8S_IMAGE, WorkPoolError, deploy_to_pool

    try:
        created = deploy_to_pool(
            cfg,
            pool=work_pool,
            pool_type=pool_type.value,
            sweep_runs=sweep_run or [],
            sweep_cron=sweep_cron,
            store=store,
            image=image or K8S_IMAGE,
            policy=policy,
        )
    except WorkPoolError as e:
        fail(str(e))
    how = "created" if created else "exists"
    typer.echo(f"Prefect API {api}: work pool {work_pool} ({pool_type.value}, {how})")
    typer.echo(f"deployments {_names(sweep_cron)}")
    _print_worker(api, work_pool, pool_type, cfg)
    typer.echo("run one:  prefect deployment run experiment/experiment  (or the Prefect UI's Run form)")


def _print_worker(api: str, pool: str, pool_type: PoolType, cfg: Config) -> None:
    """The worker the user starts: here, the venv's ``prefect worker``; on a cluster, infra/k8s's."""
    from flows.deployments import K8S_POOL, worker_command

    worker = worker_command(pool, pool_type.value)
    if pool_type is PoolType.process:
        venv_prefect = Path(sys.executable).parent / worker[0]
        typer.echo("start a worker (it runs each flow run as a process of this venv, in the project folder):")
        typer.echo(f"  PREFECT_API_URL={shlex.quote(api)} {shlex.join([str(venv_prefect), *worker[1:]])}")
        return
    typer.echo(f"on the cluster: kubectl apply -k infra/k8s, whose worker runs `{shlex.join(worker)}`")
    if pool != K8S_POOL:
        typer.echo(f"  (infra/k8s/prefect-worker.yaml polls {K8S_POOL}: set its --pool to {pool})")
    if not cfg.store.uri.startswith("s3://"):
        typer.echo("  flow-run pods keep no local store: deploy with --set store.uri=s3://BUCKET/PREFIX")


def register(app: typer.Typer) -> None:
    for command in (serve, deploy, up, down):
        app.command()(command)
