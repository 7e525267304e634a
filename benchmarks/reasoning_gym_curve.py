"""reasoning-gym through the whole loop: configs/reasoning_gym.yaml (basic_arithmetic scored by its own
``score_answer``) and its held-out accuracy curve.

    .venv/bin/python benchmarks/reasoning_gym_curve.py --json [--iterations 30] [--set key=value ...]
    .venv/bin/python benchmarks/reasoning_gym_curve.py --smoke --json   # 1 iteration, writes nowhere

The tiny built-in model is warmed up briefly on the generator's own answers, then trained with GRPO against
the dataset's scorer; held-out questions come from the generator under another derived seed. Writes
``benchmarks/results/reasoning_gym_curve.json`` (per iteration: wall seconds, stage timings, mean reward
and, at every evaluation, held-out greedy accuracy and pass@k; ``benchmarks/plot_curve.py`` draws it). The
last line (``--json``): the raw figures, the machine and versions, and ``ratio`` = final held-out accuracy /
the warmed-up base model's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.code_curve import curve_args, curve_rows, run, summary  # noqa: E402
from benchmarks.common import finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "reasoning_gym.yaml"
OUT = ROOT / "benchmarks" / "results" / "reasoning_gym_curve.json"


def main() -> None:
    args, sets = curve_args(__doc__ or "", "reasoning-gym-curve", OUT)
    cfg, events = run(sets, args.run_id, CONFIG)
    rows = curve_rows(cfg, args.run_id, events)
    s = summary(rows)
    result: dict[str, Any] = {
        "benchmark": "reasoning_gym_curve",
        "config": "configs/reasoning_gym.yaml",
        "dataset": cfg.task.env_args["dataset"],
        "overrides": sets,
        "base_accuracy": s["base_pass_rate"],
        "final_accuracy": s["final_pass_rate"],
        "accuracy_vs_iteration": s["pass_rate_vs_iteration"],
        "accuracy_vs_seconds": s["pass_rate_vs_seconds"],
        "base_pass_at_k": s["base_pass_at_k"],
        "final_pass_at_k": s["final_pass_at_k"],
        "wall_s": s["wall_s"],
        "ratio": s["ratio"],
        "ratio_definition": "final held-out greedy accuracy / the warmed-up base model's",
        "curve": rows,
    }
    print(
        f"{result['dataset']}: held-out accuracy {result['base_accuracy']:.3f} -> "
        f"{result['final_accuracy']:.3f} (ratio {result['ratio']}) in {result['wall_s']:.0f} s"
    )
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
