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


def render(data: dict[str, Any]) -> Any:
    """A rich Table: one row for the base model, one per iteration."""
    from rich.table import Table

    t = Table(
        title=f"run {data['run_id']}  "
        f"({data['iterations_committed']}/{data['iterations_planned']} iterations)"
    )
    shown = data["stages"]
    for col in ("iter", "reward", "accuracy", "pass@k", *shown, "policy sha256"):
        t.add_column(col, justify="right" if col not in ("policy sha256",) else "left")

    def fmt_eval(v: dict[str, Any]) -> tuple[str, str]:
        if "metrics" not in v:
            return "", ""
        m = v["metrics"]
        pk = " ".join(f"{k[5:]}:{m[k]:.2f}" for k in m if k.startswith("pass@"))
        return f"{m['accuracy']:.3f}", pk

    b = data["base"]
    acc, pk = fmt_eval(b["evaluate"])
    t.add_row(
        "base",
        "",
        acc,
        pk,
        *(f"warmup {b['warmup'].get('seconds', 0):.1f}s" if s == "train" else "" for s in shown),
        (b.get("policy_sha256") or "")[:16],
    )
    for it in data["iterations"]:
        st = it["stages"]
        rew = st["score_rewards"]
        reward = f"{rew['metrics']['mean_reward']:.3f}" if rew["status"] != "pending" else ""
        acc, pk = fmt_eval(st["evaluate"])
        cells = [f"{st[s]['seconds']:.2f}s" if "seconds" in st[s] else "-" for s in shown]
        t.add_row(str(it["iteration"]), reward, acc, pk, *cells, (it.get("policy_sha256") or "")[:16])
    return t
