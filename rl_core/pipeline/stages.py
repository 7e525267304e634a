"""The stage table: every stage of a run, declared once.

Each entry names the stage, its body (``body(ctx, job) -> StageResult``), the artifacts it reads — which
stage wrote each and at which iteration, i.e. from which policy version — the artifacts it writes, and the
metrics the run's summary reports. The Prefect tasks (``tasks/``), the iteration and experiment flows, replay,
the CLI's choices and help, the deployments and the run summary all read this table; a new stage is its
entry here, its body, and its task file.

Policy versions: the base model's warm-up checkpoint is version 0; the train stage of iteration k writes
version k. ``Source(offset=-1)`` reads the previous iteration's output (the policy the iteration starts
from), and at iteration 1 falls back to ``initial`` (the warm-up checkpoint) or, without one, is absent.
Asynchronous RL is one more lag: generate reads ``BEHAVIOUR_POLICY`` (``stale=True``), the policy of
iteration k-1-K with ``rollout.max_staleness`` = K, so it can run while the train stages before k run.

>>> [s.name for s in ITERATION]
['generate', 'execute_envs', 'audit', 'score_rewards', 'curriculum', 'train', 'evaluate', 'vitals']
>>> STAGES["train"].inputs["policy"]
Source(stage='train', output='checkpoint', offset=-1, initial=('warmup', 'checkpoint'), stale=False)
>>> STAGES["generate"].inputs["policy"].stale
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rl_core.artifacts.manifest import ArtifactRef, Manifest
from rl_core.evaluation.evaluate import evaluate_body
from rl_core.evaluation.vitals import vitals_body
from rl_core.generation.curriculum import curriculum_body
from rl_core.generation.episodes import generate_body
from rl_core.generation.outcomes import execute_envs_body
from rl_core.models.machine import torch_threads
from rl_core.schema.config import Config
from rl_core.scoring.audit import audit_body
from rl_core.scoring.rewards import score_rewards_body
from rl_core.training.algorithms import algorithm
from rl_core.training.sft import init_body, warmup_body
from rl_core.training.train import train_body

if TYPE_CHECKING:
    from rl_core.artifacts.stage import StageJob, StageResult
    from rl_core.run.context import RunContext


@dataclass(frozen=True)
class Source:
    """Where an input comes from: ``output`` of ``stage`` at this iteration (``offset`` 0) or the previous one
    (-1); before iteration 1 the previous policy is the base model's ``initial`` output."""

    stage: str
    output: str
    offset: int = 0
    initial: tuple[str, str] | None = None
    stale: bool = False  # also lag by ``rollout.max_staleness`` iterations (the asynchronous schedule)


@dataclass(frozen=True)
class StageSpec:
    name: str
    body: Callable[[RunContext, StageJob], StageResult]
    inputs: dict[str, Source]
    outputs: tuple[str, ...]
    summary: tuple[str, ...] = ()
    base: bool = False  # a stage of the shared base model (iteration 0 of ``_base/<hash>``), not of the run
    doc: str = ""
    needs: Callable[[Config, str], bool] = field(default=lambda cfg, name: True)  # is input ``name`` used?
    due: Callable[[Config, int], bool] = field(default=lambda cfg, k: True)  # does it run at iteration k?


def _train_needs(cfg: Config, name: str) -> bool:
    """The reference only with a KL penalty; the critic only for an algorithm that has one (ppo)."""
    if name == "reference":
        return cfg.train.kl_coef > 0
    return name != "critic" or algorithm(cfg.train.algorithm).critic


POLICY = Source("train", "checkpoint", offset=-1, initial=("warmup", "checkpoint"))
# The policy iteration k samples from: k-1 synchronously, k-1-K with rollout.max_staleness = K (so generate k
# needs nothing from the train stages still running); the warm-up checkpoint before iteration 1.
BEHAVIOUR_POLICY = Source("train", "checkpoint", offset=-1, initial=("warmup", "checkpoint"), stale=True)
# The curriculum state generate k draws its prompts from: the one committed at k-1, whatever
# rollout.max_staleness is. The curriculum stage sits before train in the table, so state k-1 is committed
# before train k-1 starts, which is when an asynchronous run submits generate k; none before iteration 1.
CURRICULUM_STATE = Source("curriculum", "state", offset=-1)

TABLE: tuple[StageSpec, ...] = (
    StageSpec(
        "init", init_body, {}, ("checkpoint",), base=True, doc="build the tiny model and its tokenizer"
    ),
    StageSpec(
        "warmup",
        warmup_body,
        {"checkpoint": Source("init", "checkpoint")},
        ("checkpoint",),
        base=True,
        doc="supervised warm-up of the base model",
    ),
    StageSpec(
        "generate",
        generate_body,
        {"policy": BEHAVIOUR_POLICY, "curriculum": CURRICULUM_STATE},
        ("rollouts",),
        needs=lambda cfg, name: name != "curriculum" or cfg.rollout.curriculum != "none",
        doc="sample completions from the policy with the rollout engine",
    ),
    StageSpec(
        "execute_envs",
        execute_envs_body,
        {"rollouts": Source("generate", "rollouts")},
        ("env_results",),
        doc="run every completion through its environment",
    ),
    StageSpec(
        "audit",
        audit_body,
        {
            "rollouts": Source("generate", "rollouts"),
            "env_results": Source("execute_envs", "env_results"),
            "state": Source("audit", "state", offset=-1),
        },
        ("flags", "state"),
        summary=("flagged_rate", "alarms"),
        due=lambda cfg, k: cfg.reward.audit.enabled,
        doc="flag reward hacking per rollout (exploits of the grader, judge injections, heuristics)",
    ),
    StageSpec(
        "score_rewards",
        score_rewards_body,
        {
            "rollouts": Source("generate", "rollouts"),
            "env_results": Source("execute_envs", "env_results"),
            "audit": Source("audit", "flags"),
        },
        ("rewards",),
        summary=("mean_reward",),
        needs=lambda cfg, name: name != "audit" or cfg.reward.audit.enabled,
        doc="rewards and group advantages (flagged completions zeroed, infrastructure failures left out)",
    ),
    StageSpec(
        "curriculum",
        curriculum_body,
        {
            "state": CURRICULUM_STATE,
            "rollouts": Source("generate", "rollouts"),
            "rewards": Source("score_rewards", "rewards"),
        },
        ("state",),
        due=lambda cfg, k: cfg.rollout.curriculum != "none",
        doc="the task sampler's state: per task seen, its samples, successes and last learning signal",
    ),
    StageSpec(
        "train",
        train_body,
        {
            "policy": POLICY,
            "optimizer": Source("train", "optimizer", offset=-1),
            "reference": Source("warmup", "checkpoint"),
            "rollouts": Source("generate", "rollouts"),
            "rewards": Source("score_rewards", "rewards"),
            "critic": Source("train", "critic", offset=-1),
        },
        ("checkpoint", "optimizer", "critic"),
        summary=("loss", "kl", "clip_frac", "entropy", "grad_norm", "logprob_mismatch_max"),
        needs=_train_needs,
        doc="one policy update; writes the next policy version, the optimizer state (and PPO's critic)",
    ),
    StageSpec(
        "evaluate",
        evaluate_body,
        {"policy": Source("train", "checkpoint", initial=("warmup", "checkpoint"))},
        ("eval",),
        summary=("*",),
        due=lambda cfg, k: k == 0 or k % cfg.eval.every == 0 or k == cfg.experiment.iterations,
        doc="held-out greedy accuracy and pass@k of the policy",
    ),
    StageSpec(
        "vitals",
        vitals_body,
        {
            "rollouts": Source("generate", "rollouts"),
            "rewards": Source("score_rewards", "rewards"),
            "state": Source("vitals", "state", offset=-1),
        },
        ("state",),
        summary=("alarms", "alarm_list"),
        doc="the iteration's vital signs (rewards, lengths, KL, entropy, throughput, prompts) and its alarms",
    ),
)

STAGES: dict[str, StageSpec] = {s.name: s for s in TABLE}
BASE = tuple(s for s in TABLE if s.base)
ITERATION = tuple(s for s in TABLE if not s.base)
ITERATION_STAGES = tuple(s.name for s in ITERATION)


def resolve_inputs(
    spec: StageSpec, cfg: Config, iteration: int, lookup: Callable[[str, int], Manifest | None]
) -> dict[str, ArtifactRef]:
    """The references ``spec`` reads at ``iteration``, from the manifests ``lookup(stage, iteration)`` finds
    (base stages at iteration 0). A needed input whose stage is not committed is an error naming both."""
    out: dict[str, ArtifactRef] = {}
    for name, src in spec.inputs.items():
        if not spec.needs(cfg, name):
            continue
        stage, output, at = src.stage, src.output, iteration + src.offset
        if src.stale:
            at -= cfg.rollout.max_staleness
        if STAGES[stage].base:
            at = 0
        elif at <= 0:
            if src.initial is None:
                continue  # nothing before the first iteration (e.g. no optimizer state yet)
            (stage, output), at = src.initial, 0
        m = lookup(stage, at)
        if m is None:
            raise RuntimeError(
                f"{spec.name} at iteration {iteration} reads {stage}.{output} of iteration {at}, "
                "which is not committed"
            )
        out[name] = m.outputs[output]
    return out


def run_body(spec: StageSpec, ctx: RunContext, job: StageJob) -> StageResult:
    """The stage's body, on the CPU threads its placement gives an iteration stage
    (``rl_core.models.placement.stage_threads``): the flow's tasks and replays both run bodies through here,
    so a replayed stage computes as the run did."""
    threads = {} if spec.base else ctx.placement.threads
    with torch_threads(threads.get(spec.name, threads.get("*"))):
        return spec.body(ctx, job)
