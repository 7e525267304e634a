"""Two runs side by side, from their stores alone (``rlfoundry compare RUN_A RUN_B``).

What differs in their configs; their curves per iteration; the first iteration where the mean reward differs
beyond sampling noise; which stages got slower or faster; and the first stage whose outputs differ (by the
sha256 of every output, base model first, then iteration by iteration in the stage table's order), which for
two runs of one config (a resumed run against an uninterrupted one, or two machines) names where they parted.

    data = compare(Store(root), "a", Store(root), "b")
"""

from __future__ import annotations

import math
from typing import Any

from rl_core.artifacts.store import Store
from rl_core.pipeline.show import collect
from rl_core.pipeline.stages import BASE, ITERATION_STAGES
from rl_core.run.context import run_config_hash
from rl_core.run.runs import config_diff, load_run
from rl_core.schema.config import config_from_dict

# A mean reward differs "beyond noise" when the gap exceeds this many standard errors of the difference.
NOISE_Z = 3.0
# A stage's time "changed" when the mean seconds of one run are more than this factor of the other's, and
# the gap is at least MIN_SECONDS.
TIME_FACTOR = 1.25
MIN_SECONDS = 0.05
# Outputs compared for "the first stage whose outputs differ": not the vitals stage's (its record is made
# from the others' and differs whenever they do).
COMPARED = tuple(s for s in ITERATION_STAGES if s != "vitals")


def _curve(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out = {}
    for it in data["iterations"]:
        st = it["stages"]
        vit = st.get("vitals", {}).get("metrics", {})
        sr = st["score_rewards"].get("metrics", {})
        out[it["iteration"]] = {
            "reward": sr.get("mean_reward"),
            "reward_se": (vit["reward_std"] / math.sqrt(vit["completions"]))
            if vit.get("completions")
            else None,
            "accuracy": st["evaluate"].get("metrics", {}).get("accuracy"),
            "kl": st["train"].get("metrics", {}).get("kl"),
            "entropy": st["train"].get("metrics", {}).get("entropy"),
            "policy_sha256": it.get("policy_sha256"),
            "alarms": [a["name"] for a in vit.get("alarm_list", [])],
        }
    return out


def first_divergence(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The first iteration whose mean rewards differ by more than NOISE_Z standard errors (each iteration's
    reward std over the square root of its completions); None if none does.

    >>> row = lambda r: {"reward": r, "reward_se": 0.01}
    >>> first_divergence({1: row(0.5), 2: row(0.5)}, {1: row(0.51), 2: row(0.7)})["iteration"]
    2
    """
    for k in sorted(set(a) & set(b)):
        ra, rb = a[k]["reward"], b[k]["reward"]
        if ra is None or rb is None:
            continue
        se = math.hypot(a[k]["reward_se"] or 0.0, b[k]["reward_se"] or 0.0)
        if abs(ra - rb) > NOISE_Z * se and ra != rb:
            return {"iteration": k, "reward_a": ra, "reward_b": rb, "noise": NOISE_Z * se}
    return None


def stage_times(da: dict[str, Any], db: dict[str, Any]) -> list[dict[str, Any]]:
    """Mean seconds per stage in each run, and whether it changed (TIME_FACTOR, MIN_SECONDS)."""

    def means(d: dict[str, Any]) -> dict[str, float]:
        got: dict[str, list[float]] = {}
        for it in d["iterations"]:
            for s, v in it["stages"].items():
                if "seconds" in v:
                    got.setdefault(s, []).append(v["seconds"])
        return {s: sum(xs) / len(xs) for s, xs in got.items()}

    ma, mb = means(da), means(db)
    rows = []
    for s in [s for s in ITERATION_STAGES if s in ma and s in mb]:
        a, b = ma[s], mb[s]
        changed = abs(a - b) >= MIN_SECONDS and max(a, b) > TIME_FACTOR * max(min(a, b), 1e-9)
        rows.append({"stage": s, "seconds_a": round(a, 4), "seconds_b": round(b, 4), "changed": changed})
    return rows


def _outputs(store: Store, run_id: str, k: int, stage: str) -> dict[str, str] | None:
    m = store.read_manifest(store.stage_uri(run_id, k, stage))
    return {name: ref.sha256 for name, ref in m.outputs.items()} if m else None


def first_output_difference(sa: Store, ra: str, sb: Store, rb: str, base: tuple[str, str]) -> dict | None:
    """The first (iteration, stage) committed in both runs whose outputs differ (base model stages first)."""
    for spec in BASE:
        oa, ob = _outputs(sa, base[0], 0, spec.name), _outputs(sb, base[1], 0, spec.name)
        if oa and ob and oa != ob:
            return {
                "iteration": 0,
                "stage": spec.name,
                "outputs": sorted(n for n in oa if oa[n] != ob.get(n)),
            }
    k = 1
    while True:
        pairs = [(s, _outputs(sa, ra, k, s), _outputs(sb, rb, k, s)) for s in COMPARED]
        if not any(oa and ob for _, oa, ob in pairs):
            return None
        for s, oa, ob in pairs:
            if oa and ob and oa != ob:
                return {"iteration": k, "stage": s, "outputs": sorted(n for n in oa if oa[n] != ob.get(n))}
        k += 1


def compare(sa: Store, ra: str, sb: Store, rb: str) -> dict[str, Any]:
    """Everything ``rlfoundry compare`` prints, as one dict."""
    rec_a, rec_b = load_run(sa, ra), load_run(sb, rb)
    # each config as the schema reads it today (defaults of sections newer than the run filled in)
    cfg_a, cfg_b = (config_from_dict(r["config"]).model_dump(mode="json") for r in (rec_a, rec_b))
    da, db = collect(sa, ra), collect(sb, rb)
    ca, cb = _curve(da), _curve(db)
    iterations = sorted(set(ca) | set(cb))
    return {
        "runs": [ra, rb],
        "same_config": run_config_hash(cfg_a) == run_config_hash(cfg_b),
        "config_differences": config_diff(cfg_a, cfg_b),
        "iterations": [{"iteration": k, "a": ca.get(k), "b": cb.get(k)} for k in iterations],
        "first_reward_divergence": first_divergence(ca, cb),
        "stage_times": stage_times(da, db),
        "first_output_difference": first_output_difference(
            sa, ra, sb, rb, (rec_a["base_id"], rec_b["base_id"])
        ),
    }


def render(data: dict[str, Any]) -> Any:
    """The comparison as rich renderables that read in 80 columns."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    a, b = data["runs"]
    parts: list[Any] = [
        Text(f"{a} vs {b}: " + ("the same config" if data["same_config"] else "configs differ"))
    ]
    parts += [Text(f"  {line}", overflow="fold") for line in data["config_differences"]]
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="per iteration (a | b)")
    for col in ("iter", "reward a", "reward b", "acc a", "acc b", "kl a", "kl b", "same policy"):
        t.add_column(col, justify="right", no_wrap=True)

    def f(row: dict | None, key: str, spec: str) -> str:
        return format(row[key], spec) if row and isinstance(row.get(key), int | float) else "-"

    for r in data["iterations"]:
        x, y = r["a"], r["b"]
        same = "-" if not (x and y) else ("yes" if x["policy_sha256"] == y["policy_sha256"] else "no")
        t.add_row(str(r["iteration"]), f(x, "reward", ".3f"), f(y, "reward", ".3f"), f(x, "accuracy", ".3f"),
                  f(y, "accuracy", ".3f"), f(x, "kl", ".3g"), f(y, "kl", ".3g"), same)  # fmt: skip
    parts.append(t)
    div = data["first_reward_divergence"]
    parts.append(
        Text(
            f"rewards differ beyond noise from iteration {div['iteration']} "
            f"({div['reward_a']:.3f} vs {div['reward_b']:.3f}, noise {div['noise']:.3f})"
            if div
            else "rewards within noise at every iteration both have"
        )
    )
    changed = [s for s in data["stage_times"] if s["changed"]]
    parts += [Text(f"stage {s['stage']}: {s['seconds_a']:.2f} s -> {s['seconds_b']:.2f} s") for s in changed]
    out = data["first_output_difference"]
    parts.append(
        Text(
            f"first outputs that differ: {out['stage']} at iteration {out['iteration']} "
            f"({', '.join(out['outputs'])})"
            if out
            else "every stage both committed has the same outputs"
        )
    )
    return Group(*parts)
