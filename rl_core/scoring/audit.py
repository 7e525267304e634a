"""The audit stage: every rollout's reward checked for hacking before it is scored.

Between execute_envs and score_rewards, for every completion of the iteration:

- the grader's own verdict flags (the environment's ``flags``): ``exited_before_tests`` (the code ended the
  process before the tests finished), ``non_plain_return`` (it returned an object, not a value);
- for environments whose completions are Python the grader runs (``envs.base.WritesPython``), the static
  rules of ``rl_core.scoring.audit_code`` on the source (early exit, tampering with builtins or the harness,
  objects equal to anything, reading files, fake test output, stalling, spawning, building code);
- for every completion, the text rules of ``rl_core.scoring.audit_text``: ``judge_injection`` (instructions to
a
  judge; when a judge is among ``reward.weights``, and in Python only in comments and strings), and the
  heuristics ``empty_answer``, ``prompt_independent`` (one answer for many prompts, mostly
  wrong), ``length_outlier``, ``repetition``.

Flags have a category: ``exploit`` (an attack on the grader: every code rule, the grader's flags,
``judge_injection``) or ``heuristic`` (the rest: a sign, not a proof). ``reward.audit.zero`` names the flags
or categories whose completions score 0 in score_rewards (default: ``exploit``). The stage writes
``flags.parquet`` (per rollout: its flags, ``zeroed``, the environment's ``infra_error``) and ``state.json``
(each flag's rate per iteration so far); its metrics are each flag's rate (``rate_<flag>``),
``flagged_rate``, ``zeroed`` and ``infra_failures``. A flag whose rate exceeds the mean of its earlier
iterations by ``reward.audit.alarm_jump`` raises an alarm: a warning in the run's log, ``alarms`` and
``alarm_<flag>`` in the metrics, and the alarm in the state. The stage is deterministic: replay gives the same
table.

    rlfoundry show RUN        # audit: flagged_rate, rate_<flag>, alarms per iteration
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from envs.base import WritesPython
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.run.context import RunContext
from rl_core.schema.config_reward import CATEGORIES, EXPLOIT, GRADER_FLAGS, zeroed_flags
from rl_core.scoring.audit_code import code_flags
from rl_core.scoring.audit_text import (
    code_text,
    empty_answer,
    judge_address,
    judge_injection,
    length_outliers,
    prompt_independent,
    repetition,
)

log = logging.getLogger("rlfoundry.audit")


def _list(v: Any) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list | tuple | np.ndarray) else []


def row_flags(
    df: pd.DataFrame, env: pd.DataFrame, python: WritesPython | None, judged: bool = True
) -> list[list[str]]:
    """Each rollout's flags (sorted), from the grader's verdict, the code rules and the text rules;
    ``judged``: a judge reads the completions (else instructions to a judge cannot move the reward and are
    not looked for); in Python, only its comments and strings are prose to a judge."""
    texts = df["completion_text"].astype(str).tolist()
    prompts = df["prompt"].astype(str).tolist()
    correct = env["correct"].to_numpy(dtype=np.float64)
    lengths = np.array([int(np.sum(m)) for m in df["loss_mask"]], dtype=np.int64)
    batch = {
        "prompt_independent": prompt_independent(prompts, texts, correct),
        "length_outlier": length_outliers(lengths),
    }
    grader = env["flags"].tolist() if "flags" in env else [[]] * len(df)
    code_cache: dict[str, list[str]] = {}
    out = []
    for i, (p, t) in enumerate(zip(prompts, texts, strict=True)):
        flags = {f for f in _list(grader[i]) if f in GRADER_FLAGS}
        if python is not None:
            src = python.solution_source(p, t)
            if src not in code_cache:
                code_cache[src] = code_flags(src)
            flags |= set(code_cache[src])
        if judged:
            prose = code_text(t) if python is not None else t
            if judge_injection(prose):
                flags.add("judge_injection")
            elif judge_address(prose):
                flags.add("judge_address")
        if empty_answer(t):
            flags.add("empty_answer")
        if repetition(t):
            flags.add("repetition")
        flags |= {name for name, hit in batch.items() if hit[i]}
        out.append(sorted(flags))
    return out


def alarms(rates: dict[str, float], history: list[dict[str, float]], jump: float) -> list[str]:
    """The flags whose rate this iteration exceeds the mean of their earlier rates by more than ``jump``.

    >>> alarms({"a": 0.3, "b": 0.05}, [{"a": 0.0}, {"a": 0.1}], 0.1)
    ['a']
    >>> alarms({"a": 0.12}, [{"a": 0.1}], 0.1)
    []
    """
    out = []
    for flag, rate in sorted(rates.items()):
        before = [h.get(flag, 0.0) for h in history]
        baseline = float(np.mean(before)) if before else 0.0
        if rate - baseline > jump:
            out.append(flag)
    return out


def audit_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg = ctx.cfg.reward.audit
    df = ctx.store.read_table(job.inputs["rollouts"])
    env = ctx.store.read_table(job.inputs["env_results"])
    if len(df) != len(env) or not (df["prompt_index"].to_numpy() == env["prompt_index"].to_numpy()).all():
        raise ValueError(f"env results {job.inputs['env_results'].uri} do not line up with the rollouts")
    python = ctx.env if isinstance(ctx.env, WritesPython) else None
    flags = row_flags(df, env, python, judged="judge" in ctx.cfg.reward.weights)
    zero = zeroed_flags(cfg.zero)
    infra = [e if isinstance(e, str) and e else None for e in env.get("infra_error", [None] * len(df))]
    table = pd.DataFrame(
        {
            "prompt_index": df["prompt_index"],
            "sample_index": df["sample_index"],
            "flags": flags,
            "zeroed": [bool(zero & set(f)) for f in flags],
            "infra_error": infra,
        }
    )
    n = max(len(df), 1)
    rates = {f: sum(f in fl for fl in flags) / n for f in CATEGORIES["all"]}
    state = ctx.store.read_json(job.inputs["state"]) if "state" in job.inputs else {"rates": [], "alarms": []}
    raised = alarms(rates, state["rates"], cfg.alarm_jump)
    for flag in raised:
        log.warning(
            "audit alarm at iteration %d: %s in %.1f%% of the rollouts (earlier mean %.1f%%)",
            job.iteration,
            flag,
            100 * rates[flag],
            100 * float(np.mean([h.get(flag, 0.0) for h in state["rates"]] or [0.0])),
        )
    new_state = {
        "rates": [*state["rates"], rates],
        "alarms": [*state["alarms"], *({"iteration": job.iteration, "flag": f} for f in raised)],
    }
    outputs = {
        "flags": ctx.store.write_table(f"{job.out_uri}/flags.parquet", table),
        "state": ctx.store.write_json(f"{job.out_uri}/state.json", new_state),
    }
    exploit = set(EXPLOIT)
    metrics = {
        "flagged_rate": float(np.mean([bool(set(f) & exploit) for f in flags])) if flags else 0.0,
        "zeroed": int(table["zeroed"].sum()),
        "infra_failures": int(sum(e is not None for e in infra)),
        "alarms": len(raised),
        **{f"rate_{f}": r for f, r in rates.items() if r > 0},
        **{f"alarm_{f}": 1.0 for f in raised},
    }
    return StageResult(outputs=outputs, metrics=metrics)
