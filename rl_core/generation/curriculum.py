"""The curriculum: a difficulty-aware sampler of the training tasks, and the stage body that keeps its state.

With ``rollout.curriculum: frontier`` the generate stage of iteration k draws its prompts with weights
computed from the state the curriculum stage committed at iteration k-1 (one row per task drawn so far:
visits, samples, successes, the iteration it was last seen, and whether its last group carried a learning
signal). A task's weight is the estimated chance that its next group of ``n`` completions has a learning
signal, i.e. that its GRPO group advantages are not all zero:

- seen, and its last group had a signal: ``1 - p^n - (1-p)^n`` with ``p = (successes + 1) / (samples + 2)``
  of that group, so the frontier (p near 0.5) weighs most;
- seen, its last group all solved or all failed, and last seen at most ``curriculum_cooldown`` iterations
  ago: 0, out of the pool;
- otherwise (unseen, or back from the cooldown): the prior of its kind (the task fields
  ``curriculum_keys``): the share of groups with a signal among the tasks of that kind last seen in the
  previous ``curriculum_window`` iterations, smoothed towards the share over all kinds,
  ``(signal_kind + overall) / (groups_kind + 1)`` with ``overall = (signal_all + 1) / (groups_all + 2)``.

Prompts are drawn without replacement with these weights from the generate stage's derived seed
(Efraimidis-Spirakis: the largest ``log(u) / w``); when fewer tasks than ``prompts_per_iteration`` have a
positive weight the rest are drawn uniformly from the others, so a batch keeps its size and the iteration
its schedule. Groups are not replaced within an iteration. The state is the curriculum stage's artifact
(``curriculum/state.parquet``), so resume and replay draw the same prompts.

    w = weights(tasks, state, iteration=5, n=8, cooldown=4, window=4, keys=["op", "digits"])
    chosen = draw(w, 64, seed)  # task indexes, in draw order
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pandas as pd

from rl_core.artifacts.manifest import ArtifactRef
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.run.context import RunContext

STATE_DTYPES = {
    "task_id": "object",
    "visits": "int64",
    "samples": "int64",
    "successes": "int64",
    "last_seen": "int64",
    "last_samples": "int64",
    "last_successes": "int64",
    "last_signal": "bool",
}


def empty_state() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in STATE_DTYPES.items()})


def signal_chance(p: float, n: int) -> float:
    """The chance that a group of ``n`` samples with pass rate ``p`` is neither all solved nor all failed.

    >>> signal_chance(0.5, 8), signal_chance(0.25, 2), signal_chance(1.0, 4)
    (0.9921875, 0.375, 0.0)
    """
    return 1.0 - p**n - (1.0 - p) ** n


def kind_of(task: dict[str, Any], keys: list[str]) -> tuple[str, ...]:
    """The task's kind: its values of the ``curriculum_keys`` fields (a missing field names the option)."""
    for k in keys:
        if k not in task:
            have = ", ".join(sorted(task))
            raise ValueError(f"rollout.curriculum_keys: the tasks have no field {k!r} (they have: {have})")
    return tuple(str(task[k]) for k in keys)


def weights(
    tasks: list[dict[str, Any]],
    state: pd.DataFrame,
    iteration: int,
    n: int,
    cooldown: int,
    window: int,
    keys: list[str],
) -> np.ndarray:
    """Each task's sampling weight at ``iteration`` from the state committed before it (module docstring)."""
    index = {t["task_id"]: i for i, t in enumerate(tasks)}
    kinds = [kind_of(t, keys) for t in tasks]
    unknown = sorted(set(state["task_id"]) - set(index))
    if unknown:
        raise ValueError(f"curriculum state names tasks that are not training tasks: {unknown[:5]}")
    rows = list(state.itertuples(index=False))
    recent = [r for r in rows if r.last_seen >= iteration - window]
    overall = (sum(r.last_signal for r in recent) + 1) / (len(recent) + 2)
    signal: dict[tuple[str, ...], int] = {}
    groups: dict[tuple[str, ...], int] = {}
    for r in recent:
        kind = kinds[index[r.task_id]]
        signal[kind] = signal.get(kind, 0) + int(r.last_signal)
        groups[kind] = groups.get(kind, 0) + 1
    w = np.array([(signal.get(k, 0) + overall) / (groups.get(k, 0) + 1) for k in kinds])
    for r in rows:
        i = index[r.task_id]
        if r.last_signal:
            w[i] = signal_chance((r.last_successes + 1) / (r.last_samples + 2), n)
        elif iteration - r.last_seen <= cooldown:
            w[i] = 0.0
    return w


def draw(w: np.ndarray, count: int, seed: int) -> list[int]:
    """``count`` indexes drawn without replacement with probabilities proportional to ``w`` (the largest
    ``log(u) / w``, u uniform in (0, 1] from ``seed``); indexes with weight 0 only when the positive ones
    run out, then uniformly. In draw order.

    >>> draw(np.array([0.0, 1.0, 0.0, 2.0]), 2, seed=7) in ([1, 3], [3, 1])
    True
    >>> len(set(draw(np.array([0.0, 1.0, 0.0, 0.0]), 3, seed=7)))
    3
    """
    if count > len(w):
        raise ValueError(f"rollout.prompts_per_iteration={count} exceeds the {len(w)} training tasks")
    rng = random.Random(seed)
    keys = []
    for wi in w:
        log_u = math.log(1.0 - rng.random())
        keys.append(log_u / wi if wi > 0 else log_u)
    order = sorted(range(len(w)), key=lambda i: (bool(w[i] > 0), keys[i]), reverse=True)
    return order[:count]


def read_state(ctx: RunContext, ref: ArtifactRef | None) -> pd.DataFrame:
    """The committed state (``ref``), or the empty one before the first curriculum stage."""
    return empty_state() if ref is None else ctx.store.read_table(ref)


def choose(
    ctx: RunContext, state_ref: ArtifactRef | None, iteration: int, seed: int
) -> tuple[list[int], dict[str, Any]]:
    """The training-task indexes generate samples at ``iteration``, and the pool's metrics."""
    r = ctx.cfg.rollout
    state = read_state(ctx, state_ref)
    w = weights(
        ctx.train_tasks, state, iteration, r.n, r.curriculum_cooldown, r.curriculum_window, r.curriculum_keys
    )
    chosen = draw(w, r.prompts_per_iteration, seed)
    return chosen, {
        "curriculum_pool": int((w > 0).sum()),
        "curriculum_out": int((w == 0).sum()),
        "curriculum_chosen_weight": float(w[chosen].mean()),
    }


def update(
    state: pd.DataFrame, rollouts: pd.DataFrame, rewards: pd.DataFrame, iteration: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The state after ``iteration``'s groups, and those groups (task_id, samples, successes, signal). A
    group has a learning signal when the rewards it was given differ."""
    if (
        len(rollouts) != len(rewards)
        or not (rollouts["prompt_index"].to_numpy() == rewards["prompt_index"].to_numpy()).all()
    ):
        raise ValueError("curriculum: rewards do not line up with rollouts")
    rows = pd.DataFrame(
        {"task_id": rollouts["task_id"], "correct": rewards["correct"], "reward": rewards["reward"]}
    )
    per = rows.groupby("task_id", sort=True).agg(
        samples=("correct", "size"), successes=("correct", "sum"), lo=("reward", "min"), hi=("reward", "max")
    )
    per["signal"] = per["hi"] > per["lo"]  # NaN (no reward given) compares False
    table = {r.task_id: r._asdict() for r in state.itertuples(index=False)}
    for tid, g in per.iterrows():
        old = table.get(tid, {"visits": 0, "samples": 0, "successes": 0})
        table[tid] = {
            "task_id": tid,
            "visits": old["visits"] + 1,
            "samples": old["samples"] + int(g["samples"]),
            "successes": old["successes"] + int(g["successes"]),
            "last_seen": iteration,
            "last_samples": int(g["samples"]),
            "last_successes": int(g["successes"]),
            "last_signal": bool(g["signal"]),
        }
    new = pd.DataFrame([table[k] for k in sorted(table)], columns=list(STATE_DTYPES)).astype(STATE_DTYPES)
    groups = per.reset_index()[["task_id", "samples", "successes", "signal"]]
    return new, groups


def curriculum_body(ctx: RunContext, job: StageJob) -> StageResult:
    """The curriculum stage: the previous state updated with this iteration's groups."""
    state = read_state(ctx, job.inputs.get("state"))
    rollouts = ctx.store.read_table(job.inputs["rollouts"])
    rewards = ctx.store.read_table(job.inputs["rewards"])
    new, groups = update(state, rollouts, rewards, job.iteration)
    ref = ctx.store.write_table(f"{job.out_uri}/state.parquet", new)
    solved = groups["successes"] == groups["samples"]
    failed = groups["successes"] == 0
    return StageResult(
        outputs={"state": ref},
        metrics={
            "tasks_seen": len(new),
            "groups": len(groups),
            "no_signal_groups": float((~groups["signal"]).mean()),
            "all_solved_groups": float(solved.mean()),
            "all_failed_groups": float(failed.mean()),
        },
    )
