"""``show`` and ``rollouts`` read in 80 columns: nothing cut to an ellipsis, the rest behind flags."""

from __future__ import annotations

from rich.console import Console

from flows.cli.inspection import _table
from rl_core.pipeline.show import render

ALARM = {"name": "kl_spike", "action": "warn", "message": "KL 0.31 > 5 x the median of earlier ones (0.05)"}


def _stage(seconds: float, **metrics) -> dict:
    return {"status": "committed", "seconds": seconds, "metrics": metrics}


def _data(iterations: int) -> dict:
    rows = []
    for k in range(1, iterations + 1):
        vitals = {"length_mean": 31.5, "alarm_list": [ALARM] if k == 3 else [], "reward_std": 0.41,
                  "prompts_seen_total": 64 * k, "prompts_planned_total": 64 * k}  # fmt: skip
        stages = {
            "generate": _stage(12.25),
            "score_rewards": _stage(0.5, mean_reward=0.123456),
            "train": _stage(100.5, kl=0.0123, entropy=1.5),
            "evaluate": _stage(3.0, accuracy=0.875) if k % 2 == 0 else {"status": "not scheduled"},
            "vitals": _stage(0.01, **vitals),
        }
        rows.append({"iteration": k, "stages": stages, "policy_sha256": "ab" * 32})
    base = {"warmup": _stage(300.0), "evaluate": _stage(2.0, accuracy=0.1), "policy_sha256": "cd" * 32}
    return {"run_id": "a-long-run-id-0001", "iterations_committed": iterations, "iterations_planned": 10_000,
            "stages": ["generate", "score_rewards", "train", "evaluate", "vitals"], "base": base,
            "iterations": rows}  # fmt: skip


def _print(renderable, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def test_show_fits_80_columns_without_cutting():
    lines = _print(render(_data(1200)))
    assert max(len(line) for line in lines) <= 80
    assert not any("…" in line for line in lines)
    header = next(line for line in lines if "reward" in line).split()
    assert header == ["iter", "reward", "acc", "kl", "entropy", "len", "sec", "alarms"]
    row = next(line for line in lines if line.strip().startswith("1200 ")).split()
    assert row == ["1200", "0.123", "0.875", "0.0123", "1.50", "31.5", "116.3"]
    # the alarm: named in its row, and in full under the table (wrapped, not cut)
    assert next(line for line in lines if line.strip().startswith("3 ")).split()[-1] == "kl_spike"
    assert "iteration 3: kl_spike (warn): KL 0.31 > 5 x the median" in " ".join(lines)
    assert lines[-1] == "prompts sampled 76800 of 76800 planned"


def test_the_wider_views_are_behind_flags():
    lines = _print(render(_data(2), stages=True, vitals=True, sha=True), width=170)
    header = next(line for line in lines if "reward" in line).split()
    assert {"r.std", "trai", "gene", "policy"} <= set(header)
    assert not any("…" in line for line in lines)


def test_rollouts_fit_80_columns_and_wrap_long_text():
    rows = [{"prompt": "Q: " + "x" * 150, "completion_text": "A" * 90, "answer": "42", "reward": 0.123456,
             "correct": 1.0, "format": 1.0, "env_parsed": "42", "finish_reason": "stop"}]  # fmt: skip
    lines = _print(_table("run iteration 1: best", rows))
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    assert next(line for line in lines if "prompt" in line).split() == [
        "prompt",
        "completion",
        "answer",
        "reward",
    ]
    assert "".join(line[:40] for line in lines).count("x") == 150  # wrapped, every character kept
    wide = _print(_table("t", rows, wide=True), width=120)
    assert "finish" in next(line for line in wide if "prompt" in line)
