"""Vital signs of an iteration, and the alarms they raise (the ``vitals`` stage, last of every iteration).

The stage reads what the iteration committed: its rollouts and rewards tables, and the metrics and seconds in
the manifests of its other stages. It writes the iteration's vital signs as its metrics (so they reach
MLflow, ``show`` and the report like any stage's) and a ``state`` (the history of the few vitals the alarm
rules compare across iterations). Everything it reads is stored, so a replayed vitals stage reproduces its
outputs bit for bit, timings included.

>>> rules = AlarmsSection()
>>> history = [{"iteration": k, "kl": 0.02, "reward_mean": 0.3} for k in (1, 2, 3)]
>>> [a["name"] for a in check({"iteration": 4, "kl": 0.5, "reward_mean": 0.3}, history, rules)]
['kl_spike']
>>> check({"iteration": 4, "kl": float("nan")}, history, rules)[0]["action"]
'stop'
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import pandas as pd

from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.run.context import RunContext
from rl_core.schema.config_alarms import AlarmsSection

# The stages whose manifests the vitals read (those of the iteration that are committed).
WATCHED = ("generate", "execute_envs", "audit", "score_rewards", "curriculum", "train", "evaluate")
FROM_TRAIN = ("kl", "entropy", "clip_frac", "grad_norm", "loss", "logprob_mismatch_max", "staleness")
# Operational counters passed through as they are (as <stage>_<name>), from whichever stage reports them: the
# rollout servers' prefix cache and restarts, the sandbox's seconds, the reward server's and the judge's
# requests, retries and restarts, infrastructure failures, audit-zeroed completions.
PASSED = ("infra_failures", "zeroed")
PASSED_PREFIXES = ("prefix_cache_", "server_", "sandbox_", "reward_model_", "judge_")
NON_FINITE_WATCHED = ("loss", "grad_norm", "kl", "entropy", "reward_mean", "advantage_std")
# What the state keeps per iteration (what the rules compare across iterations): nothing measured in seconds,
# so that two runs that compute the same have the same state (the throughput rule reads its baseline from the
# first iterations' vitals manifests instead).
HISTORY_KEYS = ("iteration", "reward_mean", "kl", "entropy", "prompts_seen_total")


def reward_vitals(rewards: pd.DataFrame) -> dict[str, float]:
    """Mean and std of the reward, the mean of each component, and the advantages' spread.

    >>> df = pd.DataFrame({"prompt_index": [0, 0], "sample_index": [0, 1], "correct": [1.0, 0.0],
    ...                    "reward": [1.0, 0.0], "advantage": [0.7, -0.7]})
    >>> v = reward_vitals(df)
    >>> v["reward_mean"], v["reward_correct_mean"], v["advantage_zero_frac"]
    (0.5, 0.5, 0.0)
    """
    out = {"reward_mean": float(rewards["reward"].mean()), "reward_std": float(rewards["reward"].std(ddof=0))}
    skip = {"prompt_index", "sample_index", "reward", "advantage"}
    for col in rewards.columns:
        if col not in skip and pd.api.types.is_numeric_dtype(rewards[col]):
            out[f"reward_{col}_mean"] = float(rewards[col].mean())
    adv = rewards["advantage"].to_numpy(dtype=float)
    out |= {
        "advantage_mean": float(adv.mean()),
        "advantage_std": float(adv.std()),
        "advantage_abs_max": float(np.abs(adv).max()) if len(adv) else 0.0,
        "advantage_zero_frac": float((np.abs(adv) < 1e-8).mean()) if len(adv) else 0.0,
    }
    return out


def length_vitals(rollouts: pd.DataFrame) -> dict[str, float]:
    """The distribution of completion lengths (tokens) and the share cut off at ``max_tokens``."""
    lengths = np.array([len(c) for c in rollouts["completion_ids"]], dtype=float)
    if not len(lengths):
        return {"completions": 0}
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return {
        "completions": len(lengths),
        "completion_tokens": int(lengths.sum()),
        "length_mean": float(lengths.mean()),
        "length_p10": float(p10),
        "length_p50": float(p50),
        "length_p90": float(p90),
        "length_max": float(lengths.max()),
        "truncation_rate": float((rollouts["finish_reason"] == "length").mean()),
        "prompts": int(rollouts["prompt_index"].nunique()),
    }


def stage_vitals(manifests: dict[str, Manifest], completion_tokens: int) -> dict[str, float]:
    """Seconds per stage, tokens/s of generate and train, the train stage's vital signs and the operational
    counters the stages report."""
    out: dict[str, float] = {f"seconds_{s}": m.timings.seconds for s, m in manifests.items()}
    out["iteration_seconds"] = round(sum(m.timings.seconds for m in manifests.values()), 4)
    for stage in ("generate", "train"):
        if stage in manifests and manifests[stage].timings.seconds > 0:
            out[f"{stage}_tokens_per_s"] = completion_tokens / manifests[stage].timings.seconds
    if "train" in manifests:
        out |= {k: manifests["train"].metrics[k] for k in FROM_TRAIN if k in manifests["train"].metrics}
    for m in manifests.values():
        out |= {
            f"{m.stage}_{k}": v
            for k, v in m.metrics.items()
            if (k in PASSED or k.startswith(PASSED_PREFIXES)) and isinstance(v, int | float)
        }
    if "audit" in manifests:
        out["audit_alarms"] = manifests["audit"].metrics.get("alarms", 0)
        out["audit_flagged_rate"] = manifests["audit"].metrics.get("flagged_rate", 0.0)
    if "evaluate" in manifests:
        out["eval_accuracy"] = manifests["evaluate"].metrics.get("accuracy")
    return out


def _alarm(name: str, action: str, message: str, value: float, threshold: float) -> dict[str, Any]:
    return {"name": name, "action": action, "message": message, "value": value, "threshold": threshold}


def _finite(x: Any) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


def check(
    vitals: dict[str, Any], history: list[dict[str, Any]], rules: AlarmsSection
) -> list[dict[str, Any]]:
    """The alarms ``vitals`` raise against the ``history`` of earlier iterations (oldest first), by rule,
    each with its action; rules set to ``off`` are not checked.

    Long: one test per rule of the alarms section, in the section's order."""
    fired: list[dict[str, Any]] = []

    def fire(rule: str, message: str, value: float, threshold: float) -> None:
        action = getattr(rules, rule).action
        if action != "off":
            fired.append(_alarm(rule, action, message, value, threshold))

    bad = [k for k in NON_FINITE_WATCHED if k in vitals and not _finite(vitals[k])]
    if bad:
        fire("non_finite", f"not finite: {', '.join(f'{k}={vitals[k]}' for k in bad)}", math.nan, 0.0)
    kls = [h["kl"] for h in history if _finite(h.get("kl")) and h.get("kl") is not None]
    kl, r = vitals.get("kl"), rules.kl_spike
    if kls and kl is not None and _finite(kl):
        limit = max(r.factor * statistics.median(kls), r.min_kl)
        if kl > limit:
            fire(
                "kl_spike",
                f"KL {kl:.4g} > {limit:.4g} ({r.factor:g} x the earlier KLs' median, at least {r.min_kl:g})",
                kl,
                limit,
            )
    first = next((h["entropy"] for h in history if h.get("entropy")), None)
    ent = vitals.get("entropy")
    if first and ent is not None and _finite(ent) and ent < rules.entropy_collapse.fraction * first:
        limit = rules.entropy_collapse.fraction * first
        fire("entropy_collapse", f"entropy {ent:.4g} < {limit:.4g} (iteration 1: {first:.4g})", ent, limit)
    _reward_rules(vitals, history, rules, fire)
    mm = vitals.get("logprob_mismatch_max")
    if mm is not None and _finite(mm) and mm > rules.logprob_mismatch.max:
        fire(
            "logprob_mismatch",
            f"trainer/engine logprob gap {mm:.4g} > {rules.logprob_mismatch.max:g}",
            mm,
            rules.logprob_mismatch.max,
        )
    _throughput_rule(vitals, history, rules, fire)
    if vitals.get("audit_alarms"):
        fire(
            "audit",
            f"the reward audit raised {vitals['audit_alarms']} rate-jump alarm(s)",
            vitals["audit_alarms"],
            0,
        )
    seen, planned = vitals.get("prompts_seen_total"), vitals.get("prompts_planned_total")
    if seen is not None and planned is not None and seen < planned:
        fire("prompts_skipped", f"{seen} prompts sampled so far, {planned} planned", seen, planned)
    return fired


def _reward_rules(
    vitals: dict[str, Any], history: list[dict[str, Any]], rules: AlarmsSection, fire: Any
) -> None:
    """reward_collapse (below a fraction of the best so far) and reward_jump (a rise of many std)."""
    rewards = [
        h["reward_mean"]
        for h in history
        if _finite(h.get("reward_mean")) and h.get("reward_mean") is not None
    ]
    now = vitals.get("reward_mean")
    if now is None or not _finite(now) or not rewards:
        return
    best, rc = max(rewards), rules.reward_collapse
    if best >= rc.min_best and now < rc.fraction * best:
        fire(
            "reward_collapse",
            f"mean reward {now:.4g} < {rc.fraction:g} x the best so far ({best:.4g})",
            now,
            rc.fraction * best,
        )
    rj = rules.reward_jump
    if len(rewards) >= rj.history:
        recent = rewards[-rj.history :]
        limit = statistics.fmean(recent) + max(rj.sigmas * statistics.pstdev(recent), rj.min_delta)
        if now > limit:
            fire(
                "reward_jump",
                f"mean reward {now:.4g} jumped above {limit:.4g} (earlier: {recent[-1]:.4g})",
                now,
                limit,
            )


def _throughput_rule(
    vitals: dict[str, Any], history: list[dict[str, Any]], rules: AlarmsSection, fire: Any
) -> None:
    """Generation tokens/s below a fraction of the median of the run's first iterations."""
    r = rules.throughput
    base = [h["generate_tokens_per_s"] for h in history[: r.baseline] if h.get("generate_tokens_per_s")]
    now = vitals.get("generate_tokens_per_s")
    if len(base) < r.baseline or now is None:
        return
    first = statistics.median(base)
    limit = r.fraction * first
    if now < limit:
        fire(
            "throughput",
            f"generation {now:.4g} tokens/s < {limit:.4g} ({r.fraction:g} x the first iterations' median, "
            f"{first:.4g})",
            now,
            limit,
        )


def _committed(ctx: RunContext, iteration: int) -> dict[str, Manifest]:
    found = {s: ctx.store.read_manifest(ctx.store.stage_uri(ctx.run_id, iteration, s)) for s in WATCHED}
    return {s: m for s, m in found.items() if m is not None}


def _with_throughput(ctx: RunContext, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with the generation tokens/s of the first ``alarms.throughput.baseline`` iterations, read
    from their committed vitals manifests."""
    out = [dict(h) for h in history]
    for h in out[: ctx.cfg.alarms.throughput.baseline]:
        m = ctx.store.read_manifest(ctx.store.stage_uri(ctx.run_id, h["iteration"], "vitals"))
        h["generate_tokens_per_s"] = m.metrics.get("generate_tokens_per_s") if m else None
    return out


def vitals_body(ctx: RunContext, job: StageJob) -> StageResult:
    """The vitals stage: this iteration's vital signs and the alarms they raise."""
    state = ctx.store.read_json(job.inputs["state"]) if "state" in job.inputs else {"history": []}
    history: list[dict[str, Any]] = state["history"]
    rollouts = ctx.store.read_table(job.inputs["rollouts"])
    vitals: dict[str, Any] = {"iteration": job.iteration}
    vitals |= length_vitals(rollouts)
    vitals |= reward_vitals(ctx.store.read_table(job.inputs["rewards"]))
    vitals |= stage_vitals(_committed(ctx, job.iteration), vitals.get("completion_tokens", 0))
    seen_before = history[-1]["prompts_seen_total"] if history else 0
    vitals["prompts_seen_total"] = seen_before + vitals.get("prompts", 0)
    vitals["prompts_planned_total"] = job.iteration * ctx.cfg.rollout.prompts_per_iteration
    alarms = check(vitals, _with_throughput(ctx, history), ctx.cfg.alarms)
    new_state = {"history": [*history, {k: vitals.get(k) for k in HISTORY_KEYS}]}
    ref = ctx.store.write_json(f"{job.out_uri}/state.json", new_state)
    metrics = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in vitals.items()}
    metrics |= {"alarms": len(alarms), "alarm_stops": sum(a["action"] == "stop" for a in alarms)}
    metrics["alarm_list"] = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in a.items()}
        for a in alarms
    ]
    return StageResult(outputs={"state": ref}, metrics=metrics)
