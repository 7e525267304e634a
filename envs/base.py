"""The environment contract, its capabilities, the outcome record, and the registry.

An environment turns a task into an episode. Episodes may be multi-turn: ``reset(task, seed)`` gives the first
observation (the prompt), then the generate stage alternates engine calls and ``step(action)`` until ``done``.
The ``outcome`` of the last step is what the reward functions score: an ``Outcome`` record (``correct`` and
``well_formed`` required, anything else the environment knows kept beside them). Environments that run
model-written code take an ``Executor`` (the sandbox in ``envs/sandbox``), never ``exec`` on the host.

What an environment can do beyond single-turn text is a small Protocol it satisfies, not an attribute probed
for: ``MultiTurn`` (``max_turns``), ``Multimodal`` (an image per task), ``Demonstrations`` (the warm-up's
segments), ``Corpus`` (the text its tokenizer is built from), ``FlawedTeacher`` (the warm-up teacher's
mistake), ``Configurable`` (its own options, a pydantic model validated from ``task.env_args``),
``BatchSteps`` (many single-turn episodes scored in one call), ``WritesPython`` (the completion is code the
grader runs: the reward audit reads it).

An environment is named in the config by its name in ``BUILTIN`` (the project's: a lazy table, so only the
named environment's module is ever imported), by ``module:Class`` (a user's own package), or by an entry point
of an installed package (group ``rlfoundry.envs``):

    env = make_env("arithmetic", {"digits": [1, 2]})
    tasks = env.tasks("train", task_cfg, seed=0)
    first = env.reset(tasks[0], seed=1)
    result = env.step("46")
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError


@dataclass
class StepResult:
    """What the environment answers to one action."""

    observation: str | None
    done: bool
    outcome: dict[str, Any] = field(default_factory=dict)
    # Images shown with the observation (PNG bytes, in order): the model sees them before its next turn.
    images: tuple[bytes, ...] = ()


@dataclass
class ExecResult:
    """What an executor reports about one run of untrusted code."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    killed_reason: str | None = None


class Outcome(BaseModel):
    """What an episode achieved, as the reward functions see it. ``correct`` and ``well_formed`` are
    required; whatever else the environment reports (``digit_match``, ``tests_passed``, ``flags``...) is kept
    as extra fields and stored beside them. ``finish_reason`` is filled by the score stage from the rollout.

    >>> Outcome(correct=True, well_formed=True, digit_match=1.0).digit_match
    1.0
    """

    model_config = ConfigDict(extra="allow")

    correct: bool = Field(description="The task was solved (what held-out accuracy counts).")
    well_formed: bool = Field(description="The answer has the form the task asks for (parsed).")
    finish_reason: str | None = Field(
        None, description="'stop' (the model ended with EOS) or 'length' (cut off); set by the score stage."
    )


@runtime_checkable
class Executor(Protocol):
    """Runs untrusted code in isolation (implemented by ``envs.sandbox``)."""

    def run(self, code: str, *, timeout_s: float, memory_mb: int) -> ExecResult: ...


@runtime_checkable
class Env(Protocol):
    """One episode at a time; instances are cheap, one per episode."""

    name: str

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        """The task list of a split ("train" or "heldout"), deterministic in ``seed``."""
        ...

    def reset(self, task: dict[str, Any], seed: int) -> str | list[dict[str, str]]:
        """Start an episode; returns the first observation: the prompt text, or chat messages
        (``[{"role": "user", "content": ...}]``, rendered with the policy's chat template)."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's action (its completion text)."""
        ...


class EnvUnavailable(RuntimeError):
    """An environment cannot run on this machine (a browser or tool it drives is missing): refused before any
    work, the message naming what is missing and how to install it."""


@runtime_checkable
class MultiTurn(Protocol):
    """Episodes of several model turns, the environment answering between them."""

    max_turns: int


@runtime_checkable
class Multimodal(Protocol):
    """Each task comes with an image the model sees before the prompt's text. The built-in policy (no
    ``model.path``) is a LLaVA with one image before the prompt, or, where the class says
    ``policy_family = "idefics3"`` (screens in every turn, of any size), an Idefics3
    (``rl_core.models.idefics3``)."""

    image_size: int

    def image(self, task: dict[str, Any]) -> bytes:
        """The task's picture (PNG bytes, deterministic)."""
        ...


@runtime_checkable
class Demonstrations(Protocol):
    """The warm-up imitates whole episodes: (text, is_model_turn) segments."""

    def demonstration(self, task: dict[str, Any], flawed: bool) -> list[tuple[str, bool]]: ...


@runtime_checkable
class Teacher(Protocol):
    """The warm-up imitates whole episodes played by a teacher: its actions, one a turn (a flawed teacher's
    when ``flawed``), played through the environment as an RL episode is (every observation and image
    the environment gives, ``rl_core.generation.turns.Scripted``)."""

    def teacher_actions(self, task: dict[str, Any], flawed: bool) -> list[str]: ...


@runtime_checkable
class FlawedTeacher(Protocol):
    """The warm-up teacher's mistaken answer to a single-turn task (``warmup.teacher_error_rate``)."""

    def flawed(self, task: dict[str, Any]) -> str: ...


@runtime_checkable
class BatchSteps(Protocol):
    """Single-turn episodes scored as a batch (one call for many completions: a sandbox pool runs them
    side by side); the same results, in order, as ``reset`` + ``step`` for each."""

    def step_many(self, episodes: Sequence[tuple[dict[str, Any], str]]) -> list[StepResult]: ...


@runtime_checkable
class WritesPython(Protocol):
    """The completion is Python that the environment's grader runs: the reward audit checks its source
    (``rl_core.scoring.audit_code``) for attacks on the grader."""

    def solution_source(self, prompt: str, completion: str) -> str: ...


@runtime_checkable
class Corpus(Protocol):
    """The text the built-in tokenizer is trained on (default: the tasks' prompts and answers)."""

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]: ...


@runtime_checkable
class Epochs(Protocol):
    """A fixed set of training tasks (a dataset): with ``order == "epochs"`` the generate stage draws each
    once per epoch, in a seeded order (``envs.dataset.epoch_order``), instead of sampling anew."""

    order: str


@runtime_checkable
class DataFiles(Protocol):
    """Tasks read from files: their sha256 are part of the base model's identity and recorded with the run,
    so a file changed under a run is refused on resume."""

    def data_files(self) -> dict[str, str]: ...


class NoOptions(BaseModel):
    """The options of an environment that has none (``task.env_args`` must be empty)."""

    model_config = ConfigDict(extra="forbid")


@runtime_checkable
class Configurable(Protocol):
    """Options of its own: ``config_model`` validates ``task.env_args``; the instance is built with them."""

    config_model: ClassVar[type[BaseModel]]


def draw_tasks(
    name: str, split: str, task_cfg: Any, seed: int, draw: Callable[[random.Random], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Distinct tasks of one split from a seeded generator: ``draw(rng)`` makes one task (with "prompt", and a
    "key" when the prompt alone does not identify it, e.g. an image task); a task belongs to the held-out
    split by a hash of its key (``is_heldout``), so the splits are disjoint."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want = task_cfg.train_size if split == "train" else task_cfg.heldout_size
    rng = random.Random(f"{name}:{seed}:{split}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(want * 50):
        if len(out) == want:
            break
        task = draw(rng)
        key = task.get("key", task["prompt"])
        if key in seen or is_heldout(key) != (split == "heldout"):
            continue
        seen.add(key)
        out.append({"task_id": f"{split}-{len(out)}", **task})
    if len(out) < want:
        raise ValueError(f"task.{split}_size={want}: only {len(out)} distinct {name} tasks drawn")
    return out


def derived_seed(*parts: object) -> int:
    """A seed derived from its parts by a hash (environments stand alone: not rl_core's helper).

    >>> derived_seed(0, "train") == derived_seed(0, "train") != derived_seed(1, "train")
    True
    """
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:15], 16)


def is_heldout(text: str) -> bool:
    """~10% of a problem space, chosen by a hash of the problem's text."""
    return hashlib.sha256(text.encode()).digest()[0] < 26


# The project's environments: name -> ``module:Class``, imported only when a run names one (no environment
# module is imported by this one: adding an environment is its file and a line here).
BUILTIN: dict[str, str] = {
    "arithmetic": "envs.arithmetic:ArithmeticEnv",
    "code": "envs.code:CodeEnv",
    "computer": "envs.computer:ComputerEnv",
    "countup": "envs.countup:CountUpEnv",
    "dataset": "envs.dataset:DatasetEnv",
    "humaneval": "envs.humaneval:HumanEvalEnv",
    "reasoning_gym": "envs.reasoning_gym:ReasoningGymEnv",
    "miniwob": "envs.miniwob:MiniWoBEnv",
    "shapes": "envs.shapes:ShapesEnv",
    "shape_rounds": "envs.shapes:ShapeRoundsEnv",
    "tooluse": "envs.tools:ToolUseEnv",
}
ENTRY_POINT_GROUP = "rlfoundry.envs"


def installed(group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
    """What installed packages declare under the entry point ``group``: name -> ``module:attribute``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=group)}


def resolve(name: str, builtin: dict[str, Any], group: str, what: str) -> tuple[Any, str]:
    """(object, where it came from) for ``name``: one of ``builtin``, a ``module:attribute``, or an entry
    point of ``group``; an unknown name is an error listing what is known. Environments and reward functions
    alike."""
    if name in builtin:
        return builtin[name], "built-in"
    target = name if ":" in name else installed(group).get(name)
    if target is None:
        known = ", ".join(sorted(builtin) + sorted(installed(group)))
        raise ValueError(
            f"unknown {what} {name!r}; known: {known}; or name one as 'module:attribute' "
            f"(or install a package declaring it under the {group!r} entry points)"
        )
    return load_object(target, what), target


def load_object(target: str, what: str) -> Any:
    """The object ``module:attribute`` names (a user's environment class or reward function), imported;
    an error names the target and what is wrong with it."""
    import importlib

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {target!r}: expected 'module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {target!r}: cannot import module {module_name!r} ({e})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


@functools.cache
def env_class(name: str) -> type:
    """The class of environment ``name``: a registered name, ``module:Class``, or an entry point of an
    installed package. It must have the ``Env`` methods (``tasks``, ``reset``, ``step``). Resolved once per
    process (``execute_envs`` makes a fresh environment per episode)."""
    if name in BUILTIN:  # imported now, alone
        target = BUILTIN[name]
        cls = load_object(target, "environment")
    else:
        cls, target = resolve(name, dict.fromkeys(BUILTIN), ENTRY_POINT_GROUP, "environment")
    missing = [m for m in ("tasks", "reset", "step") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(f"environment {name!r} ({target}) is not an environment class: lacks {missing}")
    return cls


def env_source(name: str) -> Path | None:
    """The folder of the package that defines environment ``name`` when it lives outside this project and
    outside the installed packages (a user's own package on ``sys.path``): what a Ray cluster must be sent
    to import it (``runtime_env.py_modules``). None for the project's own and for installed environments."""
    import importlib.util
    import sysconfig

    cls = env_class(name)
    top = cls.__module__.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    where = Path(spec.origin).resolve()
    home = Path(__file__).resolve().parents[1]
    installed_dirs = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if where.is_relative_to(home) or any(where.is_relative_to(d) for d in installed_dirs):
        return None
    if where.name != "__init__.py":
        raise ValueError(
            f"environment {name!r} is the single-file module {where}: make it a package (a folder with "
            "__init__.py) so that Ray workers can be sent it, or install it on the cluster"
        )
    return where.parent


def env_options(name: str, args: dict[str, Any] | None = None) -> BaseModel | None:
    """The environment's own options: ``args`` (the config's ``task.env_args``) validated by its
    ``config_model``. An environment without one takes no options."""
    cls = env_class(name)
    if not isinstance(cls, Configurable):
        if args:
            raise ValueError(f"task.env_args: environment {name!r} takes no options; got {sorted(args)}")
        return None
    model = cls.config_model
    unknown = sorted(set(args or {}) - set(model.model_fields))
    if unknown and model.model_config.get("extra") != "allow":  # a typo is never silently ignored
        raise ValueError(
            f"environment {name!r}: task.env_args.{unknown[0]}: not an option of {model.__name__} "
            f"(extra fields not permitted; options: {', '.join(model.model_fields)})"
        )
    try:
        return model.model_validate(args or {})
    except ValidationError as e:
        bad = "; ".join(f"task.env_args.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ValueError(f"environment {name!r}: {bad}") from None


def make_env(name: str, args: dict[str, Any] | None = None) -> Env:
    """A fresh environment ``name`` with its options (``task.env_args``)."""
    cls = env_class(name)
    options = env_options(name, args)
    return cls() if options is None else cls(options)


def registered() -> list[str]:
    """The project's environments and those of installed packages (none of them imported)."""
    return sorted(set(BUILTIN) | set(installed()))


def check_outcome(env: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """``outcome``, once checked against ``Outcome``: a missing or mistyped required field is an error naming
    the environment and the field."""
    try:
        Outcome.model_validate(outcome)
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ValueError(
            f"environment {env!r} returned an outcome the reward stage cannot score: {bad}"
        ) from None
    return outcome


def turns(env: Env) -> int:
    """Most model turns of one episode (1 = single-turn)."""
    return env.max_turns if isinstance(env, MultiTurn) else 1
