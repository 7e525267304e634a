"""Plot a run's curve (written by `rlfoundry run ... --curve FILE.json`): accuracy and reward vs iteration
and vs seconds, saved as a PNG beside the JSON (or at ``--out``).

    .venv/bin/python benchmarks/plot_curve.py benchmarks/results/demo_curve.json
    .venv/bin/python benchmarks/plot_curve.py --smoke --json   # the demo curve into a temporary PNG

``--json`` prints one JSON object last: the plot, the curve's base and final held-out accuracy, the machine,
and ``ratio`` = final / base accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_smoke_flag, finish  # noqa: E402

DEMO = ROOT / "benchmarks" / "results" / "demo_curve.json"


def plot(path: Path, out: Path) -> tuple[float, float]:
    """Draw the curve file ``path`` into the PNG ``out``; the base and final held-out accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
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
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return ev[0][2], ev[-1][2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("curve", type=Path, nargs="?", help="a curve JSON (with --smoke: the demo curve)")
    ap.add_argument("--out", type=Path, help="the PNG (default: beside the curve; with --smoke: a temp file)")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    add_smoke_flag(ap)
    args = ap.parse_args()
    path = args.curve or (DEMO if args.smoke else None)
    if path is None:
        ap.error("give a curve file")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or (Path(tmp) / "curve.png" if args.smoke else path.with_suffix(".png"))
        base, final = plot(path, out)
        png_bytes = out.stat().st_size
    print(f"curve: {path}  plot: {out}")
    result = {
        "benchmark": "plot_curve",
        "curve": str(path),
        "plot": str(out),
        "png_bytes": png_bytes,
        "base_accuracy": base,
        "final_accuracy": final,
        "ratio": round(final / base, 4) if base else None,
        "ratio_definition": "final / base held-out accuracy of the plotted curve",
    }
    finish(result, None, args.json, args.smoke)


if __name__ == "__main__":
    main()
