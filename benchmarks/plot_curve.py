"""Plot a run's curve (written by `rlfoundry run ... --curve FILE.json`): accuracy and reward vs iteration
and vs seconds, saved as a PNG beside the JSON.

    .venv/bin/python benchmarks/plot_curve.py benchmarks/results/demo_curve.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    path = Path(sys.argv[1])
    data = json.loads(path.read_text())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = data["curve"]
    ev = [(e["iteration"], e["elapsed_s"], e["eval"]["accuracy"]) for e in curve if e.get("eval")]
    rw = [(e["iteration"], e["elapsed_s"], e["mean_reward"]) for e in curve if "mean_reward" in e]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col, label in ((axes[0], 0, "iteration"), (axes[1], 1, "seconds since start")):
        ax.plot(
            [r[col] for r in rw],
            [r[2] for r in rw],
            color="tab:orange",
            alpha=0.6,
            label="mean reward (train rollouts)",
        )
        ax.plot(
            [e[col] for e in ev], [e[2] for e in ev], "o-", color="tab:blue", label="held-out greedy accuracy"
        )
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left")
    fig.suptitle(f"rlfoundry run {data['run_id']}: base accuracy {ev[0][2]:.3f} -> {ev[-1][2]:.3f}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"curve: {path}  plot: {out}")


if __name__ == "__main__":
    main()
