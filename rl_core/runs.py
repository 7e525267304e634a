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
import re
import secrets
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, WithJsonSchema

from rl_core.config import Config, config_from_dict
from rl_core.context import RunContext, without_placement
from rl_core.store import Store

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


def create_or_resume(
    ctx: RunContext, mode: Literal["new", "resume", "either"] = "either", *, force: bool = False
) -> Literal["created", "resumed"]:
    """The one create-or-resume rule: create ``ctx``'s run record, or accept the existing one.

    ``mode`` "new" refuses an existing run, "resume" an unknown one, "either" takes whichever applies. An
    existing run continues only with the config it was started with (``ctx.cfg`` is compared with the record),
    unless ``force``. Raises RunError (and RunIdError for a bad id; ModelFolderError for a new run whose
    ``model.path`` is not a usable policy folder) before anything is written.
    """
    check_run_id(ctx.run_id)
    uri = f"{ctx.store.run_uri(ctx.run_id)}/{RUN_RECORD}"
    if not ctx.store.exists(uri):
        if mode == "resume":
            raise RunError(f"no run {ctx.run_id!r} in {ctx.store.root}")
        if ctx.cfg.model.path:  # a bad or changed model.path folder (ModelFolderError) stops the run here
            from rl_core.policy_folder import check_model_section, check_stored_base

            check_model_section(ctx.cfg)
            check_stored_base(ctx.cfg.model.path, ctx.store, ctx.base_id)
        record = {
            "run_id": ctx.run_id,
            "config": ctx.cfg.model_dump(mode="json"),
            "config_hash": ctx.config_hash,
            "base_id": ctx.base_id,
        }
        ctx.store.write_json(uri, record)
        return "created"
    if mode == "new":
        raise RunError(
            f"run id {ctx.run_id!r} already exists in {ctx.store.root}; use `rlfoundry resume {ctx.run_id}`"
        )
    # A run continues at another world size (PLACEMENT) without --force: that is where it runs, not what.
    old = without_placement(ctx.store.read_json(uri)["config"])
    diff = config_diff(old, without_placement(ctx.cfg.model_dump(mode="json")))
    if diff and not force:
        raise RunError(
            f"run {ctx.run_id!r} exists with another config; resuming with a changed config is refused "
            "(rlfoundry resume --force overrides):\n  " + "\n  ".join(diff)
        )
    return "resumed"


def load_run(store: Store, run_id: str) -> dict[str, Any]:
    check_run_id(run_id)
    uri = f"{store.run_uri(run_id)}/{RUN_RECORD}"
    if not store.exists(uri):
        raise RunError(f"no run {run_id!r} in {store.root}")
    return store.read_json(uri)


def run_config(store: Store, run_id: str) -> Config:
    return config_from_dict(load_run(store, run_id)["config"], f"{run_id}/{RUN_RECORD}")
