"""What a run has committed so far, read from its manifests alone (works mid-run, from another terminal).

data = collect(Store(root), run_id)   # {"run_id", "base": {...}, "iterations": [...]}
"""

from __future__ import annotations

from typing import Any

from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.store import Store
from rl_core.models.model import weights_digest
from rl_core.pipeline.stages import ITERATION_STAGES as STAGES
from rl_core.pipeline.stages import STAGES as STAGE_TABLE
from rl_core.schema.config import config_from_dict


def _stage_view(m: Manifest | None) -> dict[str, Any]:
    if m is None:
        return {"status": "pending"}
    return {
        "status": m.status,
        "config_hash": m.config_hash,
        "seconds": m.timings.seconds,
        "started_at": m.timings.started_at,
        "ended_at": m.timings.started_at + m.timings.seconds if m.timings.started_at else None,
        "metrics": m.metrics,
        "artifacts": {k: v.uri for k, v in m.outputs.items()},
    }


def collect(store: Store, run_id: str) -> dict[str, Any]:
    from rl_core.run.runs import load_run, versions

    record = load_run(store, run_id)
    base_id = record["base_id"]
    cfg = record["config"]
    config = config_from_dict(cfg, f"{run_id}/run.json")
    base = {
        "base_id": base_id,
        "init": _stage_view(store.read_manifest(store.stage_uri(base_id, 0, "init"))),
        "warmup": _stage_view(store.read_manifest(store.stage_uri(base_id, 0, "warmup"))),
        "evaluate": _stage_view(store.read_manifest(store.stage_uri(run_id, 0, "evaluate"))),
    }
    wu = base["warmup"]
    if wu["status"] != "pending":
        m = store.read_manifest(store.stage_uri(base_id, 0, "warmup"))
        base["policy_sha256"] = weights_digest(m.outputs["checkpoint"].files) if m else None
    iterations = []
    last = cfg["experiment"]["iterations"]
    # the stages this run's config runs at all (the curriculum only with rollout.curriculum)
    used = [s for s in STAGES if any(STAGE_TABLE[s].due(config, k) for k in range(1, last + 1))]
    for k in range(1, last + 1):
        stages = {s: _stage_view(store.read_manifest(store.stage_uri(run_id, k, s))) for s in used}
        if all(v["status"] == "pending" for v in stages.values()):
            break
        for s in used:  # (a stage committed under an earlier schedule is shown as committed)
            if stages[s]["status"] == "pending" and not STAGE_TABLE[s].due(config, k):
                stages[s] = {"status": "not scheduled"}
        row: dict[str, Any] = {"iteration": k, "stages": stages}
        tr = stages["train"]
        if tr["status"] != "pending":
            row["policy_sha256"] = tr["metrics"].get("policy_sha256")
        iterations.append(row)
    done = sum(1 for it in iterations if it["stages"]["train"]["status"] == "committed")
    return {
        "run_id": run_id,
        "store": store.root,
        "config_hash": record["config_hash"],
        # every config the run's stages ran with, and from which iteration (rl_core.run.runs: resume --force)
        "config_versions": [
            {"from_iteration": v["from_iteration"], "config_hash": v.get("config_hash")}
            for v in versions(record)
        ],
        "config_changes": record.get("changes", []),
        "iterations_planned": cfg["experiment"]["iterations"],
        "iterations_committed": done,
        "stages": used,
        "base": base,
        "iterations": iterations,
    }


# The vital signs ``--vitals`` adds to the table (column header, vitals key, format).
VITAL_COLUMNS = (
    ("r.std", "reward_std", ".3f"),
    ("adv0", "advantage_zero_frac", ".2f"),
    ("trunc", "truncation_rate", ".2f"),
    ("gnorm", "grad_norm", ".2f"),
    ("mism", "logprob_mismatch_max", ".1e"),
    ("tok/s", "generate_tokens_per_s", ".0f"),
)


def metrics_of(stage: Any) -> dict[str, Any]:
    """A stage view's metrics, {} when it has none (or a tampered manifest holds something else)."""
    m = stage.get("metrics") if isinstance(stage, dict) else None
    return m if isinstance(m, dict) else {}


def _vitals(st: dict[str, Any]) -> dict[str, Any]:
    v = st.get("vitals") or {}
    return metrics_of(v) if isinstance(v, dict) and v.get("status") == "committed" else {}


def _f(v: Any, spec: str) -> str:
    """``v`` formatted; "-" for a value missing or of another type (a manifest is shown, never crashes)."""
    return format(v, spec) if isinstance(v, int | float) and not isinstance(v, bool) else "-"


def alarms_of(v: dict[str, Any]) -> list[dict[str, str]]:
    """The vitals' alarms that have a name, each with its fields as text."""
    found = v.get("alarm_list")
    return [
        {key: str(a.get(key, "?")) for key in ("name", "action", "message")}
        for a in (found if isinstance(found, list) else [])
        if isinstance(a, dict) and "name" in a
    ]


def render(data: dict[str, Any], stages: bool = False, vitals: bool = False, sha: bool = False) -> Any:
    """A rich table that fits 80 columns: per iteration the reward, accuracy, KL, entropy, mean completion
    length, seconds and alarms; ``stages`` adds each stage's seconds, ``vitals`` more vital signs, ``sha`` the
    policy digest (wider). Alarms are listed under it.

    Long: one row builder for the base model and one for the iterations, each column group optional."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = f"run {data['run_id']} ({data['iterations_committed']}/{data['iterations_planned']} iterations)"
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    shown = data["stages"] if stages else []
    cols = ["iter", "reward", "acc", "kl", "entropy", "len", "sec", *(c[0] for c in VITAL_COLUMNS if vitals)]
    cols += [s[:4] for s in shown] + ["alarms"] + (["policy sha256"] if sha else [])
    for col in cols:
        t.add_column(col, justify="left" if col in ("alarms", "policy sha256") else "right", no_wrap=True)

    def acc(v: dict[str, Any]) -> str:
        return _f(metrics_of(v).get("accuracy"), ".3f") if "metrics" in v else ""

    b = data["base"]
    base_cells = ["base", "", acc(b["evaluate"]), "", "", "", _f(b["warmup"].get("seconds"), ".1f")]
    base_cells += [""] * (len(cols) - len(base_cells) - (1 if sha else 0)) + (
        [str(b.get("policy_sha256") or "")[:16]] if sha else []
    )
    t.add_row(*base_cells)
    notes: list[str] = []
    for it in data["iterations"]:
        st, k = it["stages"], it["iteration"]
        v = _vitals(st)
        rew = st.get("score_rewards", {})
        reward = _f(metrics_of(rew).get("mean_reward"), ".3f") if rew.get("status") == "committed" else "-"
        tr = metrics_of(st.get("train"))
        sec = sum(x for stage in st.values() if isinstance(x := stage.get("seconds", 0), int | float))
        row = [str(k), reward, acc(st["evaluate"]), _f(tr.get("kl"), ".3g"), _f(tr.get("entropy"), ".2f")]
        row += [_f(v.get("length_mean"), ".1f"), f"{sec:.1f}"]
        row += [_f(v.get(key), spec) for _, key, spec in VITAL_COLUMNS if vitals]
        row += [_f(st[s].get("seconds"), ".1f") for s in shown]
        alarms = alarms_of(v)
        row.append(" ".join(sorted({a["name"] for a in alarms})) or ("" if v else "-"))
        if sha:
            row.append(str(it.get("policy_sha256") or "")[:16])
        t.add_row(*row)
        notes += [f"iteration {k}: {a['name']} ({a['action']}): {a['message']}" for a in alarms]
    lines = [Text(n, overflow="fold") for n in notes]
    last = data["iterations"][-1] if data["iterations"] else None
    if last and _vitals(last["stages"]):
        lv = _vitals(last["stages"])
        lines.append(
            Text(
                f"prompts sampled {lv.get('prompts_seen_total')} of {lv.get('prompts_planned_total')} planned"
            )
        )
    return Group(t, *lines)
