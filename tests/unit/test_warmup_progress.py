"""The warm-up says how far it is while it runs (minutes on a fresh CPU machine): a status event every tenth
of its steps, with the mean loss since the last one — the lines `rlfoundry run` prints above its progress
bar — and reporting it changes nothing it computes."""

from __future__ import annotations

import math
import re
from pathlib import Path

from rl_core.artifacts.report import subscribe
from rl_core.artifacts.stage import StageJob
from rl_core.run.context import RunContext
from rl_core.schema.config import load_config
from rl_core.training.sft import init_body, warmup_body

ROOT = Path(__file__).resolve().parents[2]


def test_the_warmup_reports_its_progress(state_dir: Path) -> None:
    cfg = load_config(ROOT / "configs/smoke.yaml")
    ctx = RunContext(cfg, "progress")
    root = ctx.store.root
    init = init_body(ctx, StageJob(0, {}, f"{root}/progress/iter-0000/init"))
    job = StageJob(0, {"checkpoint": init.outputs["checkpoint"]}, f"{root}/progress/iter-0000/warmup")
    seen: list[str] = []
    unsubscribe = subscribe(lambda ev: seen.append(ev["text"]) if ev["kind"] == "status" else None)
    try:
        result = warmup_body(ctx, job)
    finally:
        unsubscribe()
    steps = cfg.warmup.steps
    parsed = [re.fullmatch(r"warm-up step (\d+)/(\d+): loss ([0-9.]+)", line) for line in seen]
    assert all(parsed) and len(parsed) == 10, seen
    assert [int(m.group(1)) for m in parsed] == list(range(steps // 10, steps + 1, steps // 10))
    assert {int(m.group(2)) for m in parsed} == {steps}
    losses = [float(m.group(3)) for m in parsed]
    assert all(math.isfinite(x) and x > 0 for x in losses) and losses[-1] < losses[0]  # it learns
    assert result.metrics["steps"] == steps
