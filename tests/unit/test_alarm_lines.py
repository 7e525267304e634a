"""An alarm reaches the terminal of ``rlfoundry run`` once (issue 39): the progress display prints it the
first time, says once that it repeats, then stays quiet (a stop always prints), and the run's summary names
every alarm with its iterations; Prefect's console handler drops the alarm records the display already
printed, while the records still go to the Prefect UI (the API handler) and to a console with no display."""

from __future__ import annotations

import logging

from flows.cli.experiment import Progress
from flows.observe import ALARM_RECORD, alarms_shown_here, log_iteration


def _iteration(k: int, *alarms: tuple[str, str]) -> dict:
    return {
        "kind": "iteration",
        "iteration": k,
        "timings": {"generate": 0.1, "train": 0.2},
        "mean_reward": 0.5,
        "alarms": [{"name": n, "action": act, "message": f"{n} is off"} for n, act in alarms],
    }


def test_each_alarm_prints_once_then_says_once_that_it_repeats():
    prog = Progress(12)
    with prog.console.capture() as cap:
        for k in range(1, 10):
            prog(_iteration(k, ("kl_spike", "warn"), *([("entropy_collapse", "warn")] if k == 4 else [])))
        prog(_iteration(10, ("kl_spike", "stop")))
    out = cap.get().splitlines()
    kl = [line for line in out if "kl_spike" in line]
    assert kl == [
        "  alarm kl_spike (warn): kl_spike is off",
        "  alarm kl_spike again (iterations 1, 2): it repeats; not printed again this run (each iteration's "
        "alarms: rlfoundry show)",
        "  alarm kl_spike (stop): kl_spike is off",
    ]
    assert [line for line in out if "entropy_collapse" in line] == [
        "  alarm entropy_collapse (warn): entropy_collapse is off"
    ]
    assert prog.alarm_summary() == (
        "alarms: entropy_collapse at 1 iteration (4); kl_spike at 10 iterations (1, 2, 3, 4, 5, 6, 7, 8, ...)"
    )
    assert Progress(3).alarm_summary() is None


def test_prefects_console_drops_the_alarm_records_the_display_printed():
    from prefect import flow  # noqa: F401 -- configures Prefect's logging (a console handler on the root)
    from prefect.logging.handlers import PrefectConsoleHandler

    consoles = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    assert consoles, "Prefect's console handler is not on the root logger"
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("rlfoundry.test_alarm_lines")
    log.addHandler(Keep())
    log.propagate = False
    log.setLevel(logging.INFO)
    log_iteration(log, "r1", _iteration(3, ("kl_spike", "warn")))
    line, alarm = records
    assert getattr(alarm, ALARM_RECORD) and "ALARM kl_spike (warn) at iteration 3 of r1" in alarm.getMessage()
    assert all(h.filter(alarm) for h in consoles)  # a worker's console (no display) prints it
    alarms_shown_here()
    alarms_shown_here()  # once is enough: the filter is not stacked
    for h in consoles:
        assert not h.filter(alarm) and h.filter(line)
        assert len(h.filters) == len(set(map(id, h.filters)))
