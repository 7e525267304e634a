"""Run records: ``<store>/<run id>/run.json`` holds the config a run was started with.

Whether a run id may start a new run or continue an existing one is decided in one place,
``create_or_resume``: ``rlfoundry run`` creates (an existing id is refused), ``rlfoundry resume`` continues
(an unknown id is refused), the experiment deployment does either; continuing with a config other than the
recorded one is refused, with the difference, unless forced.

A run id names a folder (or S3 prefix) directly under the store's root, and it arrives from the command line
and from the Prefect UI's form, so it is checked against one rule before anything is read or written:
``check_run_id`` (and ``RunId`` for pydantic-typed parameters).

    >>> check_run_id("exp-1.b_2")
    'exp-1.b_2'
    >>> for bad in ("../escape", "a/b", "_base", "x;rm -rf y"):
    ...     try:
    ...         check_run_id(bad)
    ...     except RunIdError as e:
    ...         print(str(e).split(": ")[0])
    invalid run id '../escape'
    invalid run id 'a/b'
    invalid run id '_base'
    invalid run id 'x;rm -rf y'
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, WithJsonSchema

from rl_core.artifacts.store import ArtifactError, Store
from rl_core.run.context import RunContext, data_files, legacy_config_hash, run_config_hash, stage_config
from rl_core.run.preflight import check_cluster_resources, check_prompts_fit, check_ray_address
from rl_core.schema.config import Config, config_from_dict

RUN_RECORD = "run.json"


class RunError(RuntimeError):
    """A run id is taken, unknown, or its config does not match."""


# Folders the store keeps for itself beside the runs (shared base models, replay scratch, Prefect results,
# MLflow artifacts). The alphabet below already excludes them (no leading '_'); they are named so the rule
# stays true if the alphabet is ever widened.
RESERVED = frozenset({"_base", "_mlflow", "_prefect", "_replay"})
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RUN_ID_RULE = (
    "a run id is 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit, "
    f"without '..'; and none of the store's reserved names ({', '.join(sorted(RESERVED))})"
)


class RunIdError(RunError, ValueError):
    """A run id breaks the rule (``RUN_ID_RULE``); the message quotes it and the rule."""


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a safe store folder name, else RunIdError naming the id and the rule."""
    if (
        not isinstance(run_id, str)
        or not re.fullmatch(RUN_ID_PATTERN, run_id)
        or ".." in run_id
        or run_id in RESERVED
    ):
        raise RunIdError(f"invalid run id {run_id!r}: {RUN_ID_RULE}")
    return run_id


def _check_optional(run_id: str) -> str:
    return run_id and check_run_id(run_id)


# Typed parameters of the Prefect deployments: the UI's form shows the pattern, the server refuses a bad id
# before a flow run exists, and the flow checks again with the full rule.
RunId = Annotated[
    str, AfterValidator(check_run_id), WithJsonSchema({"type": "string", "pattern": RUN_ID_PATTERN})
]
OptionalRunId = Annotated[
    str,
    AfterValidator(_check_optional),
    WithJsonSchema({"type": "string", "pattern": f"^$|{RUN_ID_PATTERN}"}),
]


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def _version(cfg: Config, from_iteration: int) -> dict[str, Any]:
    return {
        "from_iteration": from_iteration,
        "config_hash": run_config_hash(cfg),
        "config": cfg.model_dump(mode="json"),
        "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def versions(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The config versions of a run record, oldest first: ``[{"from_iteration", "config_hash", "config"}]``.
    A record written before versions existed has one, the config it was started with (under the hash its
    stages were committed under then)."""
    if record.get("versions"):
        return record["versions"]
    return [{"from_iteration": 1, "config_hash": record.get("config_hash"), "config": record["config"]}]


def _hashes_of(version: dict[str, Any]) -> set[str]:
    """The hashes a version's stages may carry: its recorded one and its config's in either hash scheme."""
    out = {run_config_hash(version["config"]), legacy_config_hash(version["config"])}
    return out | ({version["config_hash"]} if version.get("config_hash") else set())


def version_hashes(store: Store, run_id: str) -> frozenset[str]:
    """Every hash the committed stages of ``run_id`` may carry (each version's); empty for a run without a
    record (the shared base model, a replay's scratch)."""
    uri = f"{store.run_uri(run_id)}/{RUN_RECORD}"
    if not store.exists(uri):
        return frozenset()
    return frozenset().union(*(_hashes_of(v) for v in versions(store.read_json(uri))))


def first_open_iteration(store: Store, run_id: str) -> int:
    """The first iteration (from 1) whose train stage, the one that ends an iteration, is not committed:
    where a new config version starts, every committed stage before it staying as it was computed."""
    from rl_core.artifacts.stage import committed

    k = 1
    while committed(store, run_id, k, "train") is not None:
        k += 1
    return k


def create_or_resume(
    ctx: RunContext, mode: Literal["new", "resume", "either"] = "either", *, force: bool = False
) -> Literal["created", "resumed"]:
    """The one create-or-resume rule: create ``ctx``'s run record, or accept the existing one.

    ``mode`` "new" refuses an existing run, "resume" an unknown one, "either" takes whichever applies. An
    existing run continues with its recorded config, or with one that changes only where it runs (PLACEMENT)
    or how far it goes (SCHEDULE: more iterations, other evaluation points): recorded, nothing recomputed.
    A change of what stages compute is refused with the difference, unless ``force``: then it is recorded as
    a new config version from the first iteration not fully committed on (``run.json`` keeps every version
    and every change); the committed stages before it stay as they were computed, under their own version. A
    change of the base model (model, task, warm-up, seed) is refused even so: start a new run. Nothing stored
    is deleted. Raises RunError (and RunIdError for a bad id; ModelFolderError for a new run whose
    ``model.path`` is not a usable policy folder; PlacementError for a config this machine cannot run;
    PromptTooLong for prompts that do not fit the context) before anything is written.
    """
    check_run_id(ctx.run_id)
    ctx.placement  # noqa: B018 -- a config that cannot run on this machine (PlacementError) stops here
    check_ray_address(ctx.cfg)  # a Ray cluster nothing answers on stops here
    check_cluster_resources(ctx)  # and one without the CPUs (GPUs) the train ranks take
    uri = f"{ctx.store.run_uri(ctx.run_id)}/{RUN_RECORD}"
    if not ctx.store.exists(uri):
        if mode == "resume":
            raise RunError(f"no run {ctx.run_id!r} in {ctx.store.root}")
        _create(ctx, uri)
        return "created"
    if mode == "new":
        raise RunError(
            f"run id {ctx.run_id!r} already exists in {ctx.store.root}; use "
            f"`{run_command('resume', ctx.run_id, ctx.store.root)}`"
        )
    check_prompts_fit(ctx)  # a --set may have changed the lengths
    _resume(ctx, uri, force)
    return "resumed"


def _create(ctx: RunContext, uri: str) -> None:
    """A new run's record: its config as version 1 (``model.path`` checked first)."""
    if ctx.cfg.model.path:  # a bad or changed model.path folder (ModelFolderError) stops the run here
        from rl_core.models.policy_folder import check_model_section, check_stored_base

        check_model_section(ctx.cfg, ctx.placement.rollout_engine)
        check_stored_base(ctx.cfg.model.path, ctx.store, ctx.base_id)
    check_prompts_fit(ctx)  # sequences longer than the context, more prompts than the task has
    record = {
        "run_id": ctx.run_id,
        "config": ctx.cfg.model_dump(mode="json"),
        "config_hash": ctx.config_hash,
        "base_id": ctx.base_id,
        "data": data_files(ctx.cfg),
        "versions": [_version(ctx.cfg, 1)],
        "changes": [],
        "placements": [_placement(ctx, 1)],
    }
    ctx.store.write_json(uri, record)
    ctx.__dict__.pop("accepted_hashes", None)


def _placement(ctx: RunContext, from_iteration: int) -> dict[str, Any]:
    """Where the run's workloads ran from ``from_iteration`` on: devices, dtypes, kernels, the GPUs of the
    trainer and of the engine, and the memory plan (rl_core.models.placement)."""
    return json.loads(json.dumps({"from_iteration": from_iteration, **ctx.placement.as_dict()}))  # as stored


def _placed(ctx: RunContext, record: dict[str, Any]) -> bool:
    """Append this machine's placement to the record when it differs from the last one; True if it did."""
    had = record.get("placements", [])
    now = _placement(ctx, first_open_iteration(ctx.store, ctx.run_id))
    if had and {**had[-1], "from_iteration": 0} == {**now, "from_iteration": 0}:
        return False
    record["placements"] = [*had, now]
    return True


def _check_data(ctx: RunContext, record: dict[str, Any]) -> None:
    """Refuse to resume on data files that changed since the run started (or that it never read)."""
    then, now = record.get("data", {}), data_files(ctx.cfg)
    for uri in sorted(set(then) | set(now)):
        if then.get(uri) != now.get(uri):
            was, got = (then.get(uri, "not read")[:12], now.get(uri, "not read")[:12])
            raise RunError(
                f"run {ctx.run_id!r}: data file {uri} changed since the run started (sha256 {was}... -> "
                f"{got}...); its stages were computed from the old rows: restore the file or start a new run"
            )


def _resume(ctx: RunContext, uri: str, force: bool) -> None:
    """Accept ``ctx``'s config for the recorded run, recording what changed (``create_or_resume``)."""
    record = ctx.store.read_json(uri)
    _check_data(ctx, record)
    new = ctx.cfg.model_dump(mode="json")
    every = config_diff(record["config"], new)
    if not every:
        if _placed(ctx, record):  # the same config on another machine (or other GPUs)
            ctx.store.write_json(uri, record)
        return
    changed = config_diff(stage_config(record["config"]), stage_config(new))
    if changed and record.get("base_id", ctx.base_id) != ctx.base_id:
        raise RunError(
            f"run {ctx.run_id!r}: the change would give it another base model ({record.get('base_id')} -> "
            f"{ctx.base_id}: model, task, warm-up or seed), so every stage would differ; start a new run "
            "instead:\n  " + "\n  ".join(changed)
        )
    if changed and not force:
        raise RunError(
            f"run {ctx.run_id!r} exists with another config; resuming with a change to what its stages "
            "compute is refused (rlfoundry resume --force records it as a new config version from the first "
            "iteration not yet committed; nothing committed is recomputed or deleted):\n  "
            + "\n  ".join(changed)
        )
    at = first_open_iteration(ctx.store, ctx.run_id) if changed else None
    history = versions(record)
    if changed:
        history = [*history, _version(ctx.cfg, at)]
    else:  # placement or schedule only: the same version, its config now the new one
        history = [*history[:-1], {**history[-1], "config": new}]
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    change = {"at": when, "diff": every, "new_version_from_iteration": at}
    record.update(
        config=new,
        config_hash=ctx.config_hash,
        versions=history,
        changes=[*record.get("changes", []), change],
    )
    _placed(ctx, record)
    ctx.store.write_json(uri, record)
    ctx.__dict__.pop("accepted_hashes", None)


def run_command(verb: str, run_id: str, store_root: str, *more: str) -> str:
    """The ``rlfoundry VERB RUN_ID`` a message tells the user to type, naming ``--store`` when the run's store
    is not the one a bare command opens (the state dir's): followed as printed, it finds the run.

    >>> run_command("resume", "r1", "s3://bucket/runs")
    'rlfoundry resume r1 --store s3://bucket/runs'
    >>> from rl_core.run.context import store_root
    >>> here = store_root(Config())
    >>> run_command("show", "r1", here), run_command("show", "r1", "file://" + here)
    ('rlfoundry show r1', 'rlfoundry show r1')
    """
    import shlex

    from rl_core.run.context import store_root as default_root

    def local(root: str) -> str:
        return root.removeprefix("file://").rstrip("/")

    words = ["rlfoundry", verb, run_id, *more]
    if local(store_root) != local(default_root(Config())):
        words += ["--store", shlex.quote(store_root)]
    return " ".join(words)


def config_for(store: Store, run_id: str, config_hash: str) -> Config:
    """The config version of ``run_id`` whose stages carry ``config_hash``: what a committed stage ran with
    (for a replay), the run's current config when no version matches."""
    record = load_run(store, run_id)
    for v in reversed(versions(record)):
        if config_hash in _hashes_of(v):
            return config_from_dict(v["config"], f"{run_id}/{RUN_RECORD} (version {v['from_iteration']})")
    return config_from_dict(record["config"], f"{run_id}/{RUN_RECORD}")


def _is_version(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("config"), dict) and type(v.get("from_iteration")) is int


# What every reader of a run record relies on: field -> its JSON type.
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {"config": dict, "config_hash": str, "base_id": str}


def load_run(store: Store, run_id: str) -> dict[str, Any]:
    """The run record of ``run_id``; RunError when there is none, ArtifactError naming the file when it is not
    the shape a record has (an object with ``RECORD_FIELDS``, ``versions`` a list of objects)."""
    check_run_id(run_id)
    uri = f"{store.run_uri(run_id)}/{RUN_RECORD}"
    if not store.exists(uri):
        raise RunError(f"no run {run_id!r} in {store.root}")
    record = store.read_json(uri)
    if not isinstance(record, dict):
        raise ArtifactError(f"run record {uri} is not a JSON object (it holds {type(record).__name__})")
    bad = [k for k, t in RECORD_FIELDS.items() if not isinstance(record.get(k), t)]
    versions = record.get("versions", [])
    if not (isinstance(versions, list) and all(_is_version(v) for v in versions)):
        bad.append("versions")
    if not isinstance(record.get("changes", []), list):
        bad.append("changes")
    if bad:
        raise ArtifactError(f"run record {uri} is corrupt: {', '.join(bad)} missing or of the wrong type")
    return record


def run_config(store: Store, run_id: str) -> Config:
    return config_from_dict(load_run(store, run_id)["config"], f"{run_id}/{RUN_RECORD}")
