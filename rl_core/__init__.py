"""rl_core: the RL library (no Prefect import), in rooms by role, each importing only the rooms listed before
it:

    schema      the configuration schema (imports nothing of the library)
    artifacts   the store, manifests, locks, state files, the stage runner
    models      policy folders, the built-in model, vision, placement and the memory plan
    run         a run's context, its record, its lineage
    generation  rollout engines, the generate and execute_envs stages
    training    losses, algorithms, PPO, critic, packing, train engines, launch, warm-up
    scoring     reward functions, reward model, judge, audit: the score stage
    evaluation  accuracy and pass@k: the evaluate stage
    pipeline    the stage table, replay, show, inspection

Each room's ``__init__`` says what it owns and what it may import; ``tests/unit/test_layout.py`` holds the
code to it. The modules' former flat paths (``rl_core.config``, ``rl_core.rollout``, ...) still import, as the
same module objects, with a DeprecationWarning, for one release."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

# Where each module of the flat layout went (removed in the release after the one that moved them).
MOVED = {
    old: f"rl_core.{room}.{old}"
    for room, olds in {
        "schema": "config config_device config_layout config_pg config_reward config_sampling overrides",
        "artifacts": "faults manifest paths report safe_state seeding stage store store_lock",
        "models": "engine_view machine memory_plan model placement policy_folder vision vllm_args",
        "run": "context lineage runs",
        "generation": "curriculum episodes outcomes rollout rollout_server",
        "training": "algorithms critic dp_check losses packing ppo sft train train_engine train_launch "
        "zero_state",
        "scoring": "audit audit_code audit_text judge judge_text judge_train reward_client reward_model "
        "rewards",
        "evaluation": "evaluate",
        "pipeline": "inspect_run replay show stages",
    }.items()
    for old in olds.split()
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import rl_core.<old>`` gives the module at its new place (the same object), with a warning."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        prefix, _, name = fullname.partition(".")
        if prefix != "rl_core" or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name.partition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self.specs[new] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the real module: put the module's own back.
        module.__spec__ = self.specs[module.__name__]


sys.meta_path.insert(0, _Moved())  # ahead of the path finders: only the names in MOVED are its
