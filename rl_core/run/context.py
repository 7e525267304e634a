"""A run's context: its config, id, store and task data, and the engines and pools it holds across stages.

Every stage body gets the context explicitly (``body(ctx, job)``). Whatever lives longer than one stage — the
rollout engine, the train engine, the reference model, the environments' process pool — is held by the
context (``ctx.held``), never by a module, so two runs (or two iterations in flight) in one process share
nothing by accident. The orchestration layer decides how long a context lives (``tasks.common.context``).

    ctx = RunContext(cfg, "20261129-abc123")
    ckpt = ctx.local_checkpoint(manifest.outputs["checkpoint"])
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_core.artifacts.manifest import ArtifactRef
from rl_core.artifacts.paths import cache_dir, state_dir
from rl_core.artifacts.store import Store
from rl_core.schema.config import Config, config_hash


def store_root(cfg: Config) -> str:
    return cfg.store.uri or str(state_dir() / "store")


def checked_root(root: str, where: str = "store") -> str:
    """A store root given apart from the config (the CLI's ``--store``, a deployment's ``store`` parameter),
    held to what ``store.uri`` is held to: no credentials in it (they would be printed and logged: the
    environment holds them), and a protocol this install reads; else a ConfigError naming ``where``, the
    root without its credentials."""
    from rl_core.schema.config_secrets import redacted, with_credentials
    from rl_core.schema.overrides import ConfigError

    if with_credentials(root):
        raise ConfigError(
            f"{where} {redacted(root)}: a URL with credentials in it (user:password@): give them in the "
            "environment instead (AWS_* for S3)"
        )
    if "://" in root:
        import fsspec

        protocol = root.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as e:
            raise ConfigError(
                f"{where} {redacted(root)}: the protocol {protocol!r} cannot be read here ({e})"
            ) from None
    return root


def open_store(cfg: Config, root: str | None = None, where: str = "store") -> Store:
    """The run's store (or ``root``, checked by ``checked_root``) with the config's S3 retry policy."""
    root = checked_root(root, where) if root else store_root(cfg)
    store = Store(root, retries=cfg.store.retries, retry_max_wait_s=cfg.store.retry_max_wait_s)
    behind = cfg.store.write_behind
    store.write_behind = not store.is_local if behind == "auto" else behind
    return store


def data_files(cfg: Config) -> dict[str, str]:
    """{file: sha256} of the data the environment reads its tasks from (``envs.base.DataFiles``), else {}."""
    from envs.base import DataFiles, make_env

    env = make_env(cfg.task.env, cfg.task.env_args)
    return env.data_files() if isinstance(env, DataFiles) else {}


def base_id(cfg: Config) -> str:
    """Runs whose model, task, warm-up and seed agree share one warmed-up base model (a dataset's files by
    their content: an edited file is another base)."""
    part = without_placement({k: cfg.model_dump(mode="json")[k] for k in ("model", "task", "warmup")})
    part["seed"] = cfg.experiment.seed
    if data := data_files(cfg):
        part["data"] = data
    return f"_base/{config_hash(part)[:16]}"


# Where the stages run, not what they compute: a run may resume with other values (rl_core.run.runs), and the
# hash its stages are committed under leaves them out.
PLACEMENT = (
    ("train", "world_size"),
    ("train", "tp_size"),
    ("train", "forward_tokens"),
    ("train", "forward_sequences"),
    ("train", "logits_chunk_mb"),
    ("model", "max_shard_size"),
    ("store", "lock_stale_after_s"),
    ("store", "lock_heartbeat_s"),
    ("store", "write_behind"),
    ("rollout", "gpus"),
    ("rollout", "gpu_memory_utilization"),
    ("rollout", "reward_gpu_memory_utilization"),
    ("rollout", "max_num_batched_tokens"),
    ("rollout", "chunked_prefill"),
    ("rollout", "cuda_graphs"),
    ("tracking", "writes"),
    ("tracking", "summary_every_s"),
)
# How far a run goes and where it evaluates, not what any stage computes: extending a run (more iterations,
# other evaluation points) needs no --force and keeps every committed stage.
SCHEDULE = (("experiment", "iterations"), ("eval", "every"))
# What only the evaluation sweep and ``rlfoundry eval`` read (inspect-ai tasks, run against stored
# checkpoints): no stage of the run computes from it, so a run may gain or change it without --force. The
# sweep's own results are committed under a hash that includes it (infra/inspect_harness.py).
SWEEP_ONLY = (("eval", "inspect"),)
# Whole sections that watch a run without changing what any stage computes (the vitals stage's alarm rules):
# left out of every hash, so that a run stored before they existed, or resumed with other rules, is the same
# run.
MONITORING = ("alarms",)
# Whole sections that say only where a run's work runs (a Ray cluster): left out of every hash as well.
PLACEMENT_SECTIONS = ("cluster",)
# How a checkpoint the train stage did not store is rebuilt: the train stage alone knows how and declares it
# when its module loads (rl_core.training.train.rebuild), so that the context stays below the stages that use
# it.
REBUILD_UNSTORED: Callable[[RunContext, ArtifactRef], None] | None = None


def without_fields(data: dict[str, Any], fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A config dump without ``fields`` ((section, name) pairs), the MONITORING and PLACEMENT_SECTIONS.

    >>> without_fields({"train": {"lr": 0.1, "world_size": 2}, "model": {}, "alarms": {}}, PLACEMENT)
    {'train': {'lr': 0.1}, 'model': {}}
    """
    skip = MONITORING + PLACEMENT_SECTIONS
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items() if k not in skip}
    for section, name in fields:
        if isinstance(out.get(section), dict):
            out[section].pop(name, None)
    return out


def without_placement(data: dict[str, Any]) -> dict[str, Any]:
    """A config dump without the PLACEMENT fields."""
    return without_fields(data, PLACEMENT)


def stage_config(data: dict[str, Any]) -> dict[str, Any]:
    """What a run's stages compute from: a config dump less PLACEMENT, SCHEDULE and SWEEP_ONLY."""
    return without_fields(data, PLACEMENT + SCHEDULE + SWEEP_ONLY)


def run_config_hash(cfg: Config | dict[str, Any]) -> str:
    """The hash a run's stages are committed under: the config less its PLACEMENT and SCHEDULE fields."""
    data = cfg if isinstance(cfg, dict) else cfg.model_dump(mode="json")
    return config_hash(stage_config(data))


def legacy_config_hash(cfg: Config | dict[str, Any]) -> str:
    """The hash stages were committed under before SCHEDULE was left out (the config less PLACEMENT): a run
    written then is still recognised, never recomputed."""
    data = cfg if isinstance(cfg, dict) else cfg.model_dump(mode="json")
    return config_hash(without_placement(data))


def unstored_dir(ref: ArtifactRef) -> Path:
    """The local folder of a checkpoint that is not in the store (keyed by its digest, like a downloaded one:
    the same bytes either way)."""
    return cache_dir("checkpoints") / ref.sha256


@dataclass
class Held:
    """What a run keeps between stages: started once, reused while it still holds the right weights."""

    rollout: Any = None  # the rollout engine (rl_core.generation.rollout); ``.loaded``: its weights' digest
    train: Any = None  # the train engine
    train_cfg: Any = None  # the train section it was built with
    train_holds: tuple[str, str | None] | None = None  # (policy sha256, optimizer sha256) it holds
    reference: tuple[str, Any] | None = None  # (checkpoint sha256, frozen reference model)
    env_pool: Any = None  # the environments' process pool, or their Ray actors (outcomes.RayWorkers)
    reward: Any = None  # the reward model's client (rl_core.scoring.reward_client), with the run's server
    # The trainer's latest weights in memory: weights sha256 -> state dict, oldest first (``remember``).
    fresh: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Held by whoever uses or rebuilds the train engine (a rebuild may be asked for by a generate running
    # beside a train stage).
    train_lock: threading.RLock = field(default_factory=threading.RLock)
    # Held by whoever syncs and samples the rollout engine (generate and evaluate may overlap when async).
    engine_lock: threading.RLock = field(default_factory=threading.RLock)
    judge: Any = None  # the LLM judge (rl_core.scoring.judge.Judge: a model on its own rollout engine)
    # Held by whoever starts or runs the judge (score stages of two iterations may overlap when async).
    judge_lock: threading.RLock = field(default_factory=threading.RLock)
    # Held by whoever starts the reward client (two score stages in flight start one server, not two).
    reward_lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, digest: str, weights: dict[str, Any], keep: int) -> None:
        """Keep ``weights`` (sha256 ``digest``) among the ``keep`` newest the rollout engine may sync from."""
        self.fresh[digest] = weights
        while len(self.fresh) > keep:
            self.fresh.pop(next(iter(self.fresh)))

    def close(self) -> None:
        """Shut down the worker processes (engines, and rollout servers, which are tied to this process, end
        with it)."""
        if self.env_pool is not None:
            self.env_pool.shutdown(cancel_futures=True)
            self.env_pool = None
        if self.reward is not None:
            self.reward.close()  # stops a reward server the run started
            self.reward = None


ServerLauncher = Callable[[str], tuple[list[str], Callable[[int], str], Callable[[], None]]]


class RunContext:
    def __init__(self, cfg: Config, run_id: str, store: Store | None = None):
        self.cfg = cfg
        self.run_id = run_id
        self.store = store or open_store(cfg)
        self.config_hash = run_config_hash(cfg)
        self.legacy_hash = legacy_config_hash(cfg)
        self.base_id = base_id(cfg)
        self.base_hash = self.base_id.split("/")[1]
        self.held = Held()
        # Starts rollout.servers vLLM servers on a checkpoint folder -> (urls, restart(i) -> url, stop); set
        # by the orchestration layer (tasks/common.py), which may start processes. None: in-process engine.
        self.server_launcher: ServerLauncher | None = None
        # Starts a reward server on a reward model folder -> (url, restart() -> url, stop); the same.
        self.reward_launcher: Callable[[str], tuple[str, Callable[[], str], Callable[[], None]]] | None = None
        # (ctx, policy) -> a checkpoint served for the inspect-ai tasks of eval.inspect, with run(job, name)
        # and close() (infra/inspect_harness.Served); the same. None: `rlfoundry eval` cannot run them.
        self.inspect_runner: Callable[[RunContext, Any], Any] | None = None

    @functools.cached_property
    def placement(self) -> Any:
        """Where and in what precision each workload runs on this machine (``rl_core.models.placement.plan``);
        PlacementError, a ConfigError, when the config cannot run here."""
        from rl_core.models.placement import Machine, plan

        return plan(self.cfg, Machine.this(), multimodal=self.multimodal)

    @functools.cached_property
    def multimodal(self) -> str | None:
        """The policy's vision-language family (``rl_core.models.vision.FAMILIES``) when it is one: a local
        ``model.path`` folder's; for the built-in policy of an environment that gives images, the one the
        environment names (``policy_family``: ``idefics3``) or ``llava``; and ``vision-language`` for a
        remote folder's there. None for a text policy."""
        from envs.base import Multimodal
        from rl_core.models.vision import family

        path = self.cfg.model.path
        local = bool(path) and "://" not in path and (Path(path) / "config.json").is_file()
        if local and family(path):
            return family(path)
        if isinstance(self.env, Multimodal):
            return "vision-language" if path else getattr(self.env, "policy_family", "llava")
        return None

    @functools.cached_property
    def accepted_hashes(self) -> frozenset[str]:
        """The config hashes a committed stage of this run may carry and still be reused: this config's, and
        every config version the run record lists (rl_core.run.runs: a resume never recomputes committed
        work)."""
        from rl_core.run.runs import version_hashes

        return frozenset({self.config_hash, self.legacy_hash}) | version_hashes(self.store, self.run_id)

    @functools.cached_property
    def env(self) -> Any:
        from envs.base import make_env

        return make_env(self.cfg.task.env, self.cfg.task.env_args)

    @functools.cached_property
    def train_tasks(self) -> list[dict[str, Any]]:
        return self.env.tasks("train", self.cfg.task, self.cfg.experiment.seed)

    @functools.cached_property
    def heldout_tasks(self) -> list[dict[str, Any]]:
        return self.env.tasks("heldout", self.cfg.task, self.cfg.experiment.seed)

    def local_checkpoint(self, ref: ArtifactRef) -> Path:
        """A verified local folder of a checkpoint. One the train stage did not store (between
        ``train.checkpoint_every`` points) is the local copy it wrote, or is rebuilt by re-running the train
        stages since the last stored checkpoint (``REBUILD_UNSTORED``: ``rl_core.training.train.rebuild``)."""
        if ref.stored is not False:
            return self.store.local_dir(ref, cache_dir("checkpoints"))
        path = unstored_dir(ref)
        if not (path / ".complete").exists():
            if REBUILD_UNSTORED is None:
                raise RuntimeError(
                    f"{ref.uri} was not stored (train.checkpoint_every) and only the train stage can rebuild "
                    "it: import rl_core.training.train (the stage table does) before asking for it"
                )
            REBUILD_UNSTORED(self, ref)
        return path

    def max_model_len(self) -> int:
        return self.cfg.model.max_position
