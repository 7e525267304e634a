"""The vitals stage's figures and alarm rules, and what the flow does with an alarm (no process started)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from flows.observe import AlarmStop, iteration_line, report_iteration
from rl_core.artifacts.manifest import Manifest, Timings
from rl_core.evaluation.vitals import check, length_vitals, reward_vitals, stage_vitals
from rl_core.run.context import run_config_hash
from rl_core.schema.config import load_config
from rl_core.schema.config_alarms import AlarmsSection

HISTORY = [
    {"iteration": k, "reward_mean": r, "kl": 0.02, "entropy": 2.0, "generate_tokens_per_s": 1000.0}
    for k, r in ((1, 0.30), (2, 0.31), (3, 0.32))
]


def _rules(**actions: str) -> AlarmsSection:
    rules = AlarmsSection()
    for name, action in actions.items():
        getattr(rules, name).action = action
    return rules


def _names(vitals: dict, history=HISTORY, rules=None) -> list[str]:
    return [a["name"] for a in check({"iteration": 4, **vitals}, history, rules or AlarmsSection())]


def test_a_healthy_iteration_raises_nothing():
    healthy = {"reward_mean": 0.33, "kl": 0.025, "entropy": 1.9, "generate_tokens_per_s": 950.0}
    assert (
        _names(
            healthy | {"logprob_mismatch_max": 1e-3, "prompts_seen_total": 32, "prompts_planned_total": 32}
        )
        == []
    )


@pytest.mark.parametrize(
    ("vitals", "rule"),
    [
        ({"loss": math.nan}, "non_finite"),
        ({"grad_norm": math.inf}, "non_finite"),
        ({"kl": 0.2}, "kl_spike"),
        ({"entropy": 0.3}, "entropy_collapse"),
        ({"reward_mean": 0.9}, "reward_jump"),
        ({"reward_mean": 0.1}, "reward_collapse"),
        ({"logprob_mismatch_max": 3.0}, "logprob_mismatch"),
        ({"generate_tokens_per_s": 300.0}, "throughput"),
        ({"audit_alarms": 2}, "audit"),
        ({"prompts_seen_total": 24, "prompts_planned_total": 32}, "prompts_skipped"),
    ],
)
def test_each_rule_fires_on_its_sign_alone(vitals, rule):
    assert _names(vitals) == [rule]
    assert _names(vitals, rules=_rules(**{rule: "off"})) == []  # off: not even checked
    (alarm,) = check({"iteration": 4, **vitals}, HISTORY, _rules(**{rule: "stop"}))
    assert alarm["action"] == "stop" and alarm["message"]


def test_thresholds_come_from_the_config():
    assert _names({"kl": 0.09}) == []  # 4.5x the median: under the default factor 5
    rules = load_config(None, ["alarms.kl_spike.factor=4"]).alarms
    assert _names({"kl": 0.09}, rules=rules) == ["kl_spike"]
    # too little history: a jump needs `history` earlier iterations, throughput its baseline
    assert _names({"reward_mean": 0.9, "generate_tokens_per_s": 1.0}, history=HISTORY[:2]) == []
    # no alarm on a KL near zero, however large the factor
    assert _names({"kl": 0.005}, history=[{**h, "kl": 0.0} for h in HISTORY]) == []


def test_figures_from_the_tables_and_manifests():
    rollouts = pd.DataFrame(
        {
            "prompt_index": [0, 0, 1, 1],
            "completion_ids": [[1, 2], [1, 2, 3, 4], [5], [6, 7, 8, 9]],
            "finish_reason": ["stop", "length", "stop", "length"],
        }
    )
    lv = length_vitals(rollouts)
    assert (lv["completion_tokens"], lv["length_max"], lv["truncation_rate"], lv["prompts"]) == (
        11,
        4.0,
        0.5,
        2,
    )
    rewards = pd.DataFrame(
        {
            "prompt_index": [0, 0],
            "sample_index": [0, 1],
            "format": [1.0, 1.0],
            "reward": [1.0, 1.0],
            "advantage": [0.0, 0.0],
        }  # fmt: skip
    )
    rv = reward_vitals(rewards)
    assert rv["reward_std"] == 0.0 and rv["advantage_zero_frac"] == 1.0 and rv["reward_format_mean"] == 1.0

    def m(stage: str, seconds: float, **metrics) -> Manifest:
        t = Timings(seconds=seconds, started_at=0)
        return Manifest(run_id="r", iteration=1, stage=stage, inputs={}, outputs={}, config_hash="h",
                        code_version="c", metrics=metrics, timings=t)  # fmt: skip

    served = {"server_restarts": 1, "prefix_cache_hit_rate": 0.5, "mean_completion_tokens": 3.0}
    sv = stage_vitals({"generate": m("generate", 2.0, **served), "train": m("train", 4.0, kl=0.1)}, 100)
    assert sv["generate_tokens_per_s"] == 50 and sv["train_tokens_per_s"] == 25 and sv["kl"] == 0.1
    assert sv["iteration_seconds"] == 6.0 and sv["generate_server_restarts"] == 1
    assert sv["generate_prefix_cache_hit_rate"] == 0.5 and "generate_mean_completion_tokens" not in sv


def test_alarm_rules_are_not_part_of_the_stages_hash():
    """Alarms watch a run: resuming with other rules is the same run (no --force), while a changed stage
    setting is not."""
    base = load_config("configs/smoke.yaml")
    assert run_config_hash(base) == run_config_hash(
        load_config("configs/smoke.yaml", ["alarms.kl_spike.action=stop"])
    )
    assert run_config_hash(base) != run_config_hash(load_config("configs/smoke.yaml", ["train.lr=0.5"]))


def _vitals(alarms: list[dict], reused: bool) -> Manifest:
    return Manifest(
        run_id="r", iteration=3, stage="vitals", inputs={}, outputs={}, config_hash="h", code_version="c",
        metrics={"alarm_list": alarms, "kl": 0.5}, timings=Timings(seconds=0.1, started_at=0), reused=reused,
    )  # fmt: skip


def test_a_stop_alarm_ends_the_run_once(caplog):
    stop = {"name": "kl_spike", "action": "stop", "message": "KL 0.5 > 0.1", "value": 0.5, "threshold": 0.1}
    warn = {**stop, "name": "entropy_collapse", "action": "warn"}
    summary = {"iteration": 3, "mean_reward": 0.5, "timings": {"train": 1.0}}
    stopped = r"stopped by alarm kl_spike at iteration 3.*rlfoundry resume r"
    with caplog.at_level("INFO", logger="rlfoundry"), pytest.raises(AlarmStop, match=stopped):
        report_iteration("r", 3, summary | {"alarms": [stop, warn]}, _vitals([stop, warn], reused=False))
    levels = {
        r.getMessage().split(" ")[1]: r.levelname
        for r in caplog.records
        if r.getMessage().startswith("ALARM")
    }
    assert levels == {"kl_spike": "ERROR", "entropy_collapse": "WARNING"}
    # The same committed iteration found again by a resume: logged, not stopped again.
    report_iteration("r", 3, summary | {"alarms": [stop]}, _vitals([stop], reused=True))
    report_iteration("r", 3, summary | {"alarms": [warn]}, _vitals([warn], reused=False))


def test_the_iteration_log_line_reads_without_the_table():
    line = iteration_line(
        {
            "iteration": 7,
            "mean_reward": 0.5,
            "eval": {"accuracy": 0.25},
            "timings": {"generate": 1.0},
            "vitals": {"kl": 0.01, "entropy": 1.5, "truncation_rate": 0.0},
        }  # fmt: skip
    )
    want = "iteration 7: reward 0.5 | accuracy 0.25 | kl 0.01 | entropy 1.5 | truncation_rate 0 | seconds "
    assert line == want + "generate 1"


def test_the_throughput_alarm_names_its_limit_and_the_first_iterations_median():
    (alarm,) = check({"iteration": 4, "generate_tokens_per_s": 300.0}, HISTORY, AlarmsSection())
    assert alarm["message"] == "generation 300 tokens/s < 500 (0.5 x the first iterations' median, 1000)"
