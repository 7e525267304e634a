"""What the Prefect form (and the REST API behind it) may set on a served deployment: the policy that
``rlfoundry serve`` / ``deploy`` fix when they register the deployments.

Whoever can start a run from the UI is not whoever runs the worker. A config field that names a place or
code is the worker's authority, so each is held to what the operator allowed:

- **where runs write** — ``store.uri`` (and the sweep's and replay's ``store``): one of ``stores`` (default:
  the served store);
- **what the worker reads** — ``model.path``, ``reward.model.path``, ``reward.judge.model`` and the files an
  environment reads (its ``path_options``: a dataset's ``train`` / ``heldout``): empty (the built-in model),
  the served value, or a path / URL under one of ``roots`` (resolved: no ``..``, no symlink out of the root);
- **whom the worker talks to** — ``rollout.server_urls``, ``reward.model.url``, ``tracking.mlflow_uri``,
  ``task.ray_address``, ``cluster.ray_address``: the served value or one of ``urls``;
- **what code the worker imports** — ``task.env`` and the ``reward.weights`` keys: the built-in and installed
  (entry point) names, and only the ``module:attr`` targets listed in ``envs`` / ``rewards``; the inspect-ai
  tasks of ``eval.inspect`` (which the evaluation sweep runs): the built-in ones only, on the held-out set
  or a dataset under one of ``roots``.

The policy lives in the deployment (its parameter schema, ``definitions.RlfoundryFormPolicy``), not in the
flow run: a run's parameters cannot change it (Prefect's API can: whoever may edit deployments, work pools
or job variables may run code on the worker, so that API is for people trusted with the workers). It is
enforced twice: the schema constrains the fields (the Prefect server refuses a run whose parameters break it,
and the form offers only the allowed choices), and the flow checks the raw parameters against the
deployment's policy before anything is imported, read or written (a run created with
``enforce_parameter_schema: false`` meets this one).

    policy = FormPolicy.served(cfg, store="", roots=["/models"])
    policy.check(raw_config)         # PolicyError naming the field and the rule
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, Field

from rl_core.schema.config import Config

SCHEMA_KEY = "RlfoundryFormPolicy"
PATH_FIELDS = (("model", "path"), ("reward.model", "path"), ("reward.judge", "model"))
# (task.ray_address and cluster.ray_address: a Ray cluster is sent the run's weights, data and code, and what
# it sends back is unpickled on the worker)
URL_FIELDS = (
    ("reward.model", "url"),
    ("tracking", "mlflow_uri"),
    ("task", "ray_address"),
    ("cluster", "ray_address"),
)


class PolicyError(ValueError):
    """A form value the served policy does not allow; the message names the field and the rule."""


def _section(data: dict[str, Any], dotted: str) -> dict[str, Any]:
    out: Any = data
    for part in dotted.split("."):
        out = out.get(part, {}) if isinstance(out, dict) else {}
    return out if isinstance(out, dict) else {}


def builtin_envs() -> list[str]:
    from envs.base import registered

    return registered()


def builtin_rewards() -> list[str]:
    """The reward names the form offers: the schema's built-ins and what installed packages declare."""
    from envs.base import installed
    from rl_core.schema.config_reward import BUILTIN_REWARDS, REWARD_ENTRY_POINTS

    return sorted(set(BUILTIN_REWARDS) | set(installed(REWARD_ENTRY_POINTS)))


class FormPolicy(BaseModel):
    stores: list[str] = Field(description="store.uri values a run may use (exactly).")
    roots: list[str] = Field([], description="Folders / URL prefixes model and reward paths may lie under.")
    urls: list[str] = Field([], description="Servers a run may talk to, besides the served config's.")
    envs: list[str] = Field(description="task.env names (module:attr targets only when listed).")
    rewards: list[str] = Field(description="reward.weights keys (module:attr targets only when listed).")
    served_paths: list[str] = Field([], description="The served config's own paths (always allowed).")

    @classmethod
    def served(
        cls,
        cfg: Config,
        *,
        store: str = "",
        stores: list[str] | None = None,
        roots: list[str] | None = None,
        urls: list[str] | None = None,
        envs: list[str] | None = None,
        rewards: list[str] | None = None,
    ) -> FormPolicy:
        """The policy of deployments served with ``cfg``: its store (and ``store``, the sweep's and replay's
        default) plus ``stores``; its own paths and servers plus ``roots`` / ``urls``; the registered names
        plus ``envs`` / ``rewards``."""
        data = cfg.model_dump(mode="json")
        served_urls = [*data["rollout"]["server_urls"]]
        served_urls += [_section(data, s)[f] for s, f in URL_FIELDS]
        return cls(
            stores=sorted({cfg.store.uri, store, *(stores or [])}),
            roots=sorted(set(roots or [])),
            urls=sorted({u for u in [*served_urls, *(urls or [])] if u}),
            envs=sorted({*builtin_envs(), cfg.task.env, *(envs or [])}),
            rewards=sorted({*builtin_rewards(), *cfg.reward.weights, *(rewards or [])}),
            served_paths=sorted({p for p in (_section(data, s)[f] for s, f in PATH_FIELDS) if p}),
        )

    # -- the check the flow makes ------------------------------------------------------------------------
    def check(self, config: dict[str, Any]) -> None:
        """Raise PolicyError for the first field of the raw ``config`` (a form's JSON, not validated yet:
        validating imports what it names) that the policy does not allow."""
        if not isinstance(config, dict):
            raise PolicyError(
                f"config: expected the experiment's fields as an object, got {type(config).__name__}"
            )
        store = _section(config, "store").get("uri", "")
        self.check_store(store, "config.store.uri")
        for section, name in PATH_FIELDS:
            value = _section(config, section).get(name, "")
            if value and not self._path_allowed(str(value)):
                raise PolicyError(
                    f"config.{section}.{name}={value!r}: not a path this deployment may read (allowed: the "
                    f"served {self.served_paths or 'none'}, or under {self.roots or 'no root'}; "
                    "rlfoundry serve --allow-root)"
                )
        given = _section(config, "rollout").get("server_urls") or []
        if not isinstance(given, list) or not all(isinstance(u, str) for u in given):
            raise PolicyError(f"config.rollout.server_urls={given!r}: expected a list of URLs")
        urls = [*given]
        named = [f"config.rollout.server_urls[{i}]" for i in range(len(urls))]
        for section, name in URL_FIELDS:
            urls.append(_section(config, section).get(name, ""))
            named.append(f"config.{section}.{name}")
        for field, url in zip(named, urls, strict=True):
            if url and url not in self.urls:
                raise PolicyError(
                    f"{field}={url!r}: not a server this deployment may talk to (allowed: "
                    f"{self.urls or 'none'}; rlfoundry serve --allow-url)"
                )
        env = _section(config, "task").get("env", "arithmetic")
        if env not in self.envs:
            raise PolicyError(
                f"config.task.env={env!r}: not an environment this deployment may load (allowed: "
                f"{', '.join(self.envs)}; module:attr targets only when rlfoundry serve --allow-env names "
                "them)"
            )
        self._check_env_paths(env, _section(config, "task").get("env_args") or {})
        self.check_inspect(_section(config, "eval").get("inspect") or {})
        weights = _section(config, "reward").get("weights") or {}
        for key in weights if isinstance(weights, dict) else []:
            if key not in self.rewards:
                raise PolicyError(
                    f"config.reward.weights[{key!r}]: not a reward function this deployment may load "
                    f"(allowed: {', '.join(self.rewards)}; module:attr targets only when rlfoundry serve "
                    "--allow-reward names them)"
                )

    def check_inspect(self, tasks: Any, field: str = "config.eval.inspect") -> None:
        """An inspect-ai task file is code the worker runs (outside any sandbox): the form may name the
        built-in tasks only; their datasets are held to the roots, as the model's path is."""
        from rl_core.schema.config_eval import BUILTIN_INSPECT_TASKS

        for name, spec in tasks.items() if isinstance(tasks, dict) else []:
            spec = spec if isinstance(spec, dict) else {}
            task = spec.get("task", "qa")
            if task not in BUILTIN_INSPECT_TASKS:
                raise PolicyError(
                    f"{field}.{name}.task={task!r}: a task file is code the worker runs "
                    f"(allowed: the built-in tasks, {', '.join(BUILTIN_INSPECT_TASKS)})"
                )
            data = spec.get("dataset", "heldout")
            if data != "heldout" and not self._path_allowed(str(data)):
                raise PolicyError(
                    f"{field}.{name}.dataset={data!r}: not a path this deployment may read "
                    f"(allowed: heldout, or under {self.roots or 'no root'}; rlfoundry serve --allow-root)"
                )

    def _check_env_paths(self, env: str, args: dict[str, Any]) -> None:
        """The files an allowed environment reads (its ``path_options``, e.g. a dataset's train and held-out
        files) are held to the same roots as the model's path."""
        from envs.base import env_class

        try:
            cls = env_class(env)  # an allowed name: built-in, entry point or a target the operator listed
        except ValueError:
            return  # cannot be imported: validating the config reports it
        for name in getattr(cls, "path_options", ()):
            value = args.get(name, "") if isinstance(args, dict) else ""
            if value and not self._path_allowed(str(value)):
                raise PolicyError(
                    f"config.task.env_args.{name}={value!r}: not a path this deployment may read (allowed: "
                    f"under {self.roots or 'no root'}; rlfoundry serve --allow-root)"
                )

    def check_store(self, store: str, field: str = "store") -> None:
        if store not in self.stores:
            raise PolicyError(
                f"{field}={store!r}: not a store this deployment may use (allowed: "
                f"{', '.join(repr(s) for s in self.stores)}; rlfoundry serve --allow-store)"
            )

    def _path_allowed(self, value: str) -> bool:
        if value in self.served_paths:
            return True
        if "://" in value:
            parts = value.split("://", 1)[1].split("/")
            if any(p in ("..", ".") for p in parts):
                return False
            return any(value.startswith(r.rstrip("/") + "/") for r in self.roots if "://" in r)
        real = os.path.realpath(os.path.expanduser(value))  # as the config reads it: ~ and ~user expanded
        for root in self.roots:
            if "://" in root:
                continue
            base = os.path.realpath(root)
            if real == base or real.startswith(base.rstrip("/") + "/"):
                return True
        return False

    # -- the schema the server enforces and the form renders --------------------------------------------
    def _under_roots(self) -> list[str]:
        """A regular expression per root: a path under it that never climbs out (no ``..`` part)."""
        return [re.escape(r.rstrip("/")) + r"/(?!(.*/)?\.\.?(/|$)).*" for r in self.roots]

    def constrain(self, schema: dict[str, Any]) -> dict[str, Any]:
        """A deployment's parameter schema with the policy's constraints on the fields it has (the
        experiment's config, the sweep's and replay's ``store``), and the policy itself."""
        defs = schema.setdefault("definitions", {})

        def field(section: str, name: str) -> dict[str, Any]:
            return defs.get(section, {}).get("properties", {}).get(name, {})

        if "store" in schema.get("properties", {}):
            schema["properties"]["store"]["enum"] = self.stores
        if "Config" in defs:
            field("StoreSection", "uri")["enum"] = self.stores
            field("TaskSection", "env")["enum"] = self.envs
            field("RewardSection", "weights")["propertyNames"] = {"enum": self.rewards}
            items = {"type": "string", "enum": self.urls} if self.urls else {"type": "string"}
            field("RolloutSection", "server_urls").update(
                items=items, **({} if self.urls else {"maxItems": 0})
            )
            field("RewardModelSettings", "url")["enum"] = ["", *self.urls]
            field("TrackingSection", "mlflow_uri")["enum"] = ["", *self.urls]
            field("TaskSection", "ray_address")["enum"] = ["", *self.urls]
            field("ClusterSection", "ray_address")["enum"] = ["", *self.urls]
            exact = [re.escape(p) for p in ["", *self.served_paths]]
            under = self._under_roots()
            pattern = "^(" + "|".join(exact + under) + ")$"
            for section, name in (
                ("ModelSection", "path"),
                ("RewardModelSettings", "path"),
                ("JudgeSettings", "model"),
            ):
                field(section, name)["pattern"] = pattern
        if "InspectTask" in defs:  # the experiment's eval.inspect, the sweep's inspect
            from rl_core.schema.config_eval import BUILTIN_INSPECT_TASKS

            under = self._under_roots()
            field("InspectTask", "task")["enum"] = list(BUILTIN_INSPECT_TASKS)
            field("InspectTask", "dataset")["pattern"] = "^(heldout|" + "|".join(under or ["(?!)"]) + ")$"
        defs[SCHEMA_KEY] = {
            "description": "What the form may set (rlfoundry serve's policy); not a field.",
            "x-rlfoundry-policy": self.model_dump(mode="json"),
        }
        return schema

    @classmethod
    def of_schema(cls, schema: dict[str, Any] | None) -> FormPolicy | None:
        held = ((schema or {}).get("definitions") or {}).get(SCHEMA_KEY) or {}
        data = held.get("x-rlfoundry-policy")
        return None if data is None else cls.model_validate(data)


def deployment_policy() -> FormPolicy | None:
    """The policy of the deployment this flow run was created from (None outside a deployment run: a flow
    called as a function runs its caller's own config). A deployment without one (registered by another
    version) gets the policy of its own default config."""
    from prefect.runtime import deployment

    dep_id = deployment.id
    if not dep_id:
        return None
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        dep = client.read_deployment(dep_id)
    held = FormPolicy.of_schema(dep.parameter_openapi_schema)
    if held is not None:
        return held
    served = (dep.parameters or {}).get("config")
    cfg = Config.model_validate(served) if served else Config()
    return FormPolicy.served(cfg, store=(dep.parameters or {}).get("store", ""))
