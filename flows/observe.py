"""What a run shows in the Prefect UI while it runs, and what its alarms do.

The flow run's page gets a log line per status event and per iteration (reward, accuracy, KL, entropy,
lengths, stage seconds), one per alarm (a warning, or an error when it stops the run), and a table artifact
of the iterations' vital signs, a row per iteration, its description naming their MLflow runs. Iterations
that end within ``tracking.summary_every_s`` of the last table share the next one (``RecordWindow``: a table
is an API call of ~20 ms, as long as a whole small step's records); the first and the last iteration, and
one with an alarm, get theirs at once. An alarm whose action is ``stop`` ends the flow run once its iteration
is committed (``AlarmStop``); an iteration resumed with its vitals already committed does not stop again, so
``rlfoundry resume`` continues the run like any other.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from rl_core.artifacts.manifest import Manifest

# The vital signs of an iteration's artifact table, in this order (those the iteration has).
TABLE_KEYS = (
    "reward_mean",
    "reward_std",
    "eval_accuracy",
    "advantage_std",
    "advantage_zero_frac",
    "kl",
    "entropy",
    "clip_frac",
    "grad_norm",
    "logprob_mismatch_max",
    "length_mean",
    "length_p90",
    "truncation_rate",
    "staleness",
    "prompts",
    "prompts_seen_total",
    "prompts_planned_total",
    "generate_tokens_per_s",
    "train_tokens_per_s",
    "iteration_seconds",
)


class AlarmStop(RuntimeError):
    """An alarm whose action is ``stop`` fired: the run ends after its iteration was committed."""


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def iteration_line(summary: dict[str, Any]) -> str:
    """One log line for an iteration's summary event (flows.experiment.summarize).

    >>> iteration_line({"iteration": 2, "mean_reward": 0.25, "timings": {"generate": 1.5, "train": 2.0},
    ...                 "vitals": {"kl": 0.01, "alarms": 0}})
    'iteration 2: reward 0.25 | kl 0.01 | seconds generate 1.5, train 2'
    """
    parts = [f"iteration {summary['iteration']}: reward {_fmt(summary.get('mean_reward'))}"]
    if summary.get("eval"):
        parts.append(f"accuracy {_fmt(summary['eval'].get('accuracy'))}")
    vit = summary.get("vitals") or {}
    parts += [f"{k} {_fmt(vit[k])}" for k in ("kl", "entropy", "length_mean", "truncation_rate") if k in vit]
    parts.append("seconds " + ", ".join(f"{s} {_fmt(t)}" for s, t in summary.get("timings", {}).items()))
    return " | ".join(parts)


def alarms_of(vitals: Manifest | None) -> list[dict[str, Any]]:
    return list(vitals.metrics.get("alarm_list", [])) if vitals is not None else []


# Marks an alarm's log record: a console whose own display prints the alarms drops it (alarms_shown_here).
ALARM_RECORD = "rlfoundry_alarm"


def log_iteration(log: Any, run_id: str, summary: dict[str, Any]) -> None:
    """The iteration's line and one line per alarm (a warning; an error for a stop)."""
    log.info(iteration_line(summary))
    k = summary["iteration"]
    for a in summary.get("alarms", []):
        line = f"ALARM {a['name']} ({a['action']}) at iteration {k} of {run_id}: {a['message']}"
        (log.error if a["action"] == "stop" else log.warning)(line, extra={ALARM_RECORD: True})


def _not_an_alarm(record: logging.LogRecord) -> bool:
    return not getattr(record, ALARM_RECORD, False)


def alarms_shown_here() -> None:
    """This process's Prefect console handlers drop the alarm records (``rlfoundry run`` prints each alarm
    in its progress display, once); they still reach the Prefect UI through its API handler, and a worker's
    console (no display) keeps printing them."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for lg in loggers:
        for h in getattr(lg, "handlers", []):
            if isinstance(h, PrefectConsoleHandler) and _not_an_alarm not in h.filters:
                h.addFilter(_not_an_alarm)


class RecordWindow:
    """An experiment's iteration summaries, held until they are written together: ``add`` returns the ones to
    write now, every one held, when ``every_s`` passed since the last write (0: always), at the first
    iteration, or when asked (``at_once``: the last iteration, an alarm); ``take`` the rest, at the end.

    >>> clock = iter([0.0, 1.0, 2.0, 12.0, 13.0]).__next__
    >>> w = RecordWindow(10.0, clock)
    >>> [[s["iteration"] for s in w.add({"iteration": k})] for k in (1, 2, 3, 4)]
    [[1], [], [], [2, 3, 4]]
    >>> w.add({"iteration": 5}), [s["iteration"] for s in w.take()]
    ([], [5])
    """

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.held: list[dict[str, Any]] = []
        self.since: float | None = None  # when the last ones were written

    def add(self, summary: dict[str, Any], at_once: bool = False) -> list[dict[str, Any]]:
        self.held.append(summary)
        now = self.clock()
        if at_once or self.since is None or now - self.since >= self.every_s:
            self.since = now
            return self.take()
        return []

    def take(self) -> list[dict[str, Any]]:
        out, self.held = self.held, []
        return out


def report_iteration(
    run_id: str,
    k: int,
    summary: dict[str, Any],
    vitals: Manifest | None,
    later: Any = None,
    store_root: str | None = None,
    tables: list[dict[str, Any]] | None = None,
) -> None:
    """Log the iteration and its alarms to the flow run, and attach the vital signs of ``tables`` (the
    iterations whose table is due, ``RecordWindow``; default: this one) as a table artifact; raise
    ``AlarmStop`` if a stop alarm fired in vitals computed now (not reused from an earlier attempt).
    ``later`` (a function taking a callable: the run's lineage writer, ``LineageWriter.submit`` bound to the
    iteration) creates the artifact where the lineage records are written; the flow waits for it before it
    ends."""
    from tasks.common import run_logger  # (here: the lineage writer imports this module, not the stages)

    log_iteration(run_logger(), run_id, summary)
    tables = [summary] if tables is None else tables
    if later is None:
        attach_vitals(run_id, tables)
    else:
        attach_later(run_id, tables, later)
    stops = [a for a in alarms_of(vitals) if a["action"] == "stop"]
    if stops and not vitals.reused:  # type: ignore[union-attr]
        names = ", ".join(a["name"] for a in stops)
        look, go = (_command(v, run_id, store_root) for v in ("show", "resume"))
        raise AlarmStop(
            f"run {run_id} stopped by alarm {names} at iteration {k} (iteration {k} is committed): "
            f"{stops[0]['message']}. Look: {look}; continue: {go} "
            f"(optionally --set alarms.{stops[0]['name']}.action=warn)"
        )


def attach_later(run_id: str, summaries: list[dict[str, Any]], later: Any) -> None:
    """``attach_vitals`` for the current flow run, handed to ``later`` (the lineage writer's submit); nothing
    outside a flow run or without ``summaries``."""
    from prefect.runtime import flow_run

    here = flow_run.get_id()
    if summaries and here:
        later(functools.partial(attach_vitals, run_id, summaries, here))


def _command(verb: str, run_id: str, store_root: str | None) -> str:
    from rl_core.run.runs import run_command

    return run_command(verb, run_id, store_root) if store_root else f"rlfoundry {verb} {run_id}"


def attach_vitals(run_id: str, summaries: list[dict[str, Any]], flow_run_id: Any = None) -> None:
    """The vital signs and alarms of ``summaries`` (iterations, in order) as one table artifact of the
    current flow run, or of ``flow_run_id`` (the deployment's flow run, which shows the experiment as its
    subflow): a row per iteration, keyed ``iteration-0007`` for one, ``iterations-0002-0007`` for several;
    nothing outside a flow run or without vitals."""
    from prefect.artifacts import TableArtifact
    from prefect.context import get_run_context
    from prefect.exceptions import MissingContextError

    if flow_run_id is None:
        try:
            get_run_context()
        except MissingContextError:
            return
    summaries = [s for s in summaries if s.get("vitals")]
    if not summaries:
        return
    rows = []
    for s in summaries:
        m = s["vitals"]
        row = {"iteration": s["iteration"]} | {
            key: _fmt(m[key]) for key in TABLE_KEYS if m.get(key) is not None
        }
        alarms = [f"ALARM {a['name']} ({a['action']}): {a['message']}" for a in s.get("alarms", [])]
        rows.append(row | ({"alarms": "; ".join(alarms)} if alarms else {}))
    first, last = summaries[0]["iteration"], summaries[-1]["iteration"]
    links = [s["mlflow_run"] for s in summaries if s.get("mlflow_run")]
    where = ", ".join(f"[{x}]({x})" if x.startswith("http") else x for x in links) or "-"
    key = f"iteration-{last:04d}" if first == last else f"iterations-{first:04d}-{last:04d}"
    what = f"iteration {last}" if first == last else f"iterations {first}-{last}"
    TableArtifact(
        key=key,
        table=rows,
        description=f"Vital signs of {run_id}, {what}. MLflow run {where}. `rlfoundry show {run_id}`",
        flow_run_id=flow_run_id,
    ).create()


def mirror(run_id: str) -> Any:
    """A listener (``rl_core.artifacts.report.subscribe``) that repeats a run's status lines, iteration lines,
    alarms and vital-sign tables on the calling flow run: the deployment's flow run, whose page is the one a
    researcher who started the run from the UI has open (the experiment itself is its subflow)."""
    from prefect.runtime import flow_run

    from tasks.common import run_logger

    log, parent = run_logger(), flow_run.get_id()

    def listen(ev: dict[str, Any]) -> None:
        if ev["kind"] == "status":
            log.info(ev["text"])
        elif ev["kind"] == "iteration" and ev["iteration"] > 0:
            log_iteration(log, run_id, ev)
            if ev.get("tables"):  # the iterations whose table is due (RecordWindow)
                attach_vitals(run_id, ev["tables"], parent)

    return listen
