"""A run as one self-contained HTML page (``rlfoundry report RUN_ID``): it opens offline, from a file.

Figures (inline SVG, drawn with matplotlib): reward and accuracy against iteration and against wall-clock
time, with the alarms marked; the completion-length distribution and truncation rate; the seconds of each
stage per iteration. Then the alarms, and a rollout viewer: per iteration, the best, worst and random
samples with their reward components and environment outcome, multi-turn episodes turn by turn.

    html = build(Store(root), "run-id")     # a str; the CLI writes it to RUN_ID.html
"""

from __future__ import annotations

import html
import io
import json
from typing import Any

from rl_core.artifacts.store import Store
from rl_core.pipeline.inspect_run import samples
from rl_core.pipeline.show import alarms_of, collect, metrics_of

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{margin-top:1.6em;border-bottom:1px solid #ccc}
.fig{display:inline-block;margin:.5em} .fig svg{width:520px;height:auto}
table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
.alarm-stop{color:#b00020;font-weight:bold} .alarm-warn{color:#a06000}
pre{white-space:pre-wrap;margin:0;font-family:ui-monospace,monospace} details{margin:.3em 0}
"""
# How every report begins: ``rlfoundry report --out`` replaces only a file that begins so (a report it wrote).
REPORT_MARK = "<!doctype html><html><head><meta charset=utf-8><title>rlfoundry run "
SAMPLE_COLUMNS = (
    "prompt",
    "completion_text",
    "answer",
    "reward",
    "advantage",
    "env_correct",
    "finish_reason",
)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _series(data: dict[str, Any]) -> dict[str, list[Any]]:
    """Per committed iteration: reward, accuracy (None when not evaluated), wall-clock seconds since the
    run's first stage started, lengths, truncation and stage seconds."""
    out: dict[str, list[Any]] = {k: [] for k in ("k", "reward", "acc", "wall", "p10", "p50", "p90", "trunc")}
    out["stages"] = []
    start = None
    for it in data["iterations"]:
        st = it["stages"]
        if st["train"].get("status") != "committed":
            continue
        vit = st.get("vitals", {}).get("metrics", {})
        out["k"].append(it["iteration"])
        out["reward"].append(st["score_rewards"]["metrics"].get("mean_reward"))
        out["acc"].append(st["evaluate"].get("metrics", {}).get("accuracy"))
        ends = [v["ended_at"] for v in st.values() if v.get("ended_at")]
        begins = [v["started_at"] for v in st.values() if v.get("started_at")]
        start = min(begins) if start is None and begins else start
        out["wall"].append((max(ends) - start) if ends and start else None)
        for key, name in (("p10", "length_p10"), ("p50", "length_p50"), ("p90", "length_p90")):
            out[key].append(vit.get(name))
        out["trunc"].append(vit.get("truncation_rate"))
        out["stages"].append({s: v["seconds"] for s, v in st.items() if "seconds" in v})
    return out


def figures(data: dict[str, Any], alarms: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, inline SVG) of each figure.

    Long: four small matplotlib figures, drawn one after the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = _series(data)
    out = []
    for x_key, title in (
        ("k", "reward and accuracy vs iteration"),
        ("wall", "reward and accuracy vs wall clock (s)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = s[x_key]
        ax.plot(xs, s["reward"], marker=".", label="mean reward")
        acc = [(x, a) for x, a in zip(xs, s["acc"], strict=True) if a is not None and x is not None]
        if acc:
            ax.plot(*zip(*acc, strict=True), marker="o", label="held-out accuracy")
        for a in alarms:  # the alarms on the timeline
            if a["iteration"] in s["k"]:
                x = xs[s["k"].index(a["iteration"])]
                ax.axvline(x, color="red" if a["action"] == "stop" else "orange", ls="--", lw=1)
                ax.annotate(a["name"], (x, ax.get_ylim()[1]), rotation=90, va="top", fontsize=7)
        ax.set_xlabel("iteration" if x_key == "k" else "seconds since the first stage")
        ax.legend(fontsize=7)
        out.append((title, _svg(fig)))
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    if any(v is not None for v in s["p50"]):
        ax.fill_between(
            s["k"], [v or 0 for v in s["p10"]], [v or 0 for v in s["p90"]], alpha=0.3, label="p10-p90"
        )
        ax.plot(s["k"], s["p50"], label="median length (tokens)")
        ax2 = ax.twinx()
        ax2.plot(s["k"], s["trunc"], color="grey", ls=":", label="truncation rate")
        ax2.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.legend(fontsize=7)
    out.append(("completion lengths and truncation", _svg(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = [n for n in data["stages"] if any(n in row for row in s["stages"])]
    bottom = [0.0] * len(s["k"])
    for n in names:
        vals = [row.get(n, 0.0) for row in s["stages"]]
        ax.bar(s["k"], vals, bottom=bottom, label=n)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=6, ncol=2)
    out.append(("seconds per stage", _svg(fig)))
    plt.close(fig)
    return out


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"<pre>{html.escape(str(v))}</pre>"


def _samples_html(store: Store, run_id: str, k: int, n: int) -> str:
    try:
        picked = samples(store, run_id, k, n)
    except FileNotFoundError:
        return "<p>no rollouts committed</p>"
    parts = []
    for name, rows in picked.items():
        first = rows[0] if rows else {}
        cols = [c for c in SAMPLE_COLUMNS if c in first]
        # the reward components (the rewards table's float columns) and the environment's outcome
        components = [
            c for c, v in first.items() if isinstance(v, float) and c not in cols and not c.startswith("env_")
        ]
        comps = components + [c for c in first if c.startswith("env_") and c not in cols][:4]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in (*cols, *comps))
        body = []
        for r in rows:
            cells = "".join(f"<td>{_cell(r.get(c))}</td>" for c in (*cols, *comps))
            turns = ""
            if isinstance(r.get("turns"), list | tuple) and r["turns"]:  # multi-turn: turn by turn
                obs = list(r.get("observations") or [])
                items = "".join(
                    f"<li><b>model</b> <pre>{html.escape(str(t))}</pre>"
                    + (f"<b>env</b> <pre>{html.escape(str(obs[i]))}</pre>" if i < len(obs) else "")
                    + "</li>"
                    for i, t in enumerate(r["turns"])
                )
                turns = f"<tr><td colspan={len(cols) + len(comps)}><ol class=turns>{items}</ol></td></tr>"
            body.append(f"<tr>{cells}</tr>{turns}")
        parts.append(f"<h4>{name}</h4><table><tr>{head}</tr>{''.join(body)}</table>")
    return "".join(parts)


def build(store: Store, run_id: str, per_iteration: int = 3) -> str:
    """The report of ``run_id`` as one HTML document (no external resources)."""
    from rl_core.run.runs import load_run

    data = collect(store, run_id)
    config = load_run(store, run_id)["config"]
    alarms = [
        {**a, "iteration": it["iteration"]}
        for it in data["iterations"]
        for a in alarms_of(metrics_of(it["stages"].get("vitals")))  # a malformed list: the alarms it names
    ]
    figs = "".join(
        f'<div class="fig"><h3>{html.escape(t)}</h3>{svg}</div>' for t, svg in figures(data, alarms)
    )
    rows = "".join(
        f'<tr class="alarm-{a["action"]}"><td>{a["iteration"]}</td><td>{html.escape(a["name"])}</td>'
        f"<td>{a['action']}</td><td>{html.escape(a['message'])}</td></tr>"
        for a in alarms
    )
    alarm_html = (
        f"<table><tr><th>iteration</th><th>alarm</th><th>action</th><th>why</th></tr>{rows}</table>"
        if alarms
        else "<p>none</p>"
    )
    last = len(data["iterations"]) - 1
    viewer = "".join(
        f"<details{' open' if i == last else ''}><summary>iteration {it['iteration']}</summary>"
        f"{_samples_html(store, run_id, it['iteration'], per_iteration)}</details>"
        for i, it in enumerate(data["iterations"])
    )
    base = data["base"]["evaluate"].get("metrics", {}).get("accuracy")
    title = f"rlfoundry run {html.escape(run_id)}"
    head = f"<meta charset=utf-8><title>{title}</title><style>{CSS}</style>"
    summary = (
        f"{data['iterations_committed']}/{data['iterations_planned']} iterations committed; base accuracy "
        f"{base}; store {html.escape(data['store'])}; config hash {data['config_hash'][:16]}"
    )
    return (
        f"<!doctype html><html><head>{head}</head><body><h1>{title}</h1><p>{summary}</p>"
        f"<details><summary>config</summary><pre>{html.escape(json.dumps(config, indent=1))}</pre></details>"
        f"<h2>curves</h2>{figs}<h2>alarms</h2>{alarm_html}<h2>rollouts</h2>{viewer}</body></html>"
    )
