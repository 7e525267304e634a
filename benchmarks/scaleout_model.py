"""Scale-out model: iteration time against GPU count, from the stage times measured here.

    .venv/bin/python benchmarks/scaleout_model.py --json   # also writes results/scaleout_model.json
    .venv/bin/python benchmarks/scaleout_model.py --smoke --json   # one scenario, writes nowhere

An analytic model, not a measurement at scale. Its inputs are the per-iteration stage times of a run on this
machine: by default the medians over the demo run's iterations without evaluation
(``benchmarks/results/demo_curve.json``, from ``make demo``; each iteration's ``timings`` and ``elapsed_s``),
orchestration being what the iteration's wall time spends outside the four stages (Prefect tasks, store
writes, MLflow). They are taken as one GPU's (and two environment workers') share of a fixed global batch;
``--generate`` etc. override them. On G GPUs:

- generate: ``t_gen / R`` on R rollout servers (independent, data-parallel over prompts);
- env (execute_envs + score_rewards): ``t_env * w0 / W`` on ``W = workers_per_gpu * G`` CPU workers
  (``w0`` = the workers measured with);
- train: ``t_train / T + a * 2 (T - 1) / T`` on T data-parallel ranks, the second term a ring all-reduce of
  the gradients (``a`` = ``--allreduce-frac`` of the one-GPU train time: assumed, nothing here measured it);
- orchestration: a fixed cost per iteration, whatever G.

Synchronous loop (colocated: all G GPUs generate, then all train): ``orch + gen(G) + env + train(G)``.
Asynchronous loop (generation of the next batch overlaps training on this one, one step off-policy; the GPUs
split into R rollout servers and T = G - R trainer ranks, the best split chosen):
``orch + max(gen(R) + env, train(T))``; on one GPU nothing overlaps and it equals the synchronous loop.
The bottleneck is the largest term on the critical path. ``--compute-scale`` multiplies the GPU stages (gen,
train, all-reduce) to ask the same of a costlier model; orchestration and env work stay as measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, result_file  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "scaleout_model.json"
GPUS = (1, 2, 4, 8, 16, 32, 64)
STAGES = ("generate", "execute_envs", "score_rewards", "train")


@dataclass(frozen=True)
class StageTimes:
    """Seconds per iteration on one GPU (env stages on ``env_workers`` CPU workers)."""

    generate: float
    env: float
    train: float
    orchestration: float
    env_workers: int = 2
    source: str = "command line"


def measured(curve: Path, env_workers: int = 2) -> StageTimes:
    """Medians over the RL iterations of a curve file that ran no evaluation (evaluation is periodic)."""
    entries = json.loads(curve.read_text())["curve"]
    rows = []
    for prev, cur in zip(entries, entries[1:], strict=False):
        t = cur["timings"]
        if "evaluate" in t or not all(s in t for s in STAGES):
            continue
        wall = cur["elapsed_s"] - prev["elapsed_s"]
        env = t["execute_envs"] + t["score_rewards"]
        rows.append((t["generate"], env, t["train"], wall - sum(t.values())))
    if not rows:
        raise SystemExit(f"{curve}: no iteration with all of {STAGES} and no evaluation")
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    source = f"{curve.name}: medians of {len(rows)} iterations"
    return StageTimes(*med, env_workers=env_workers, source=source)


@dataclass(frozen=True)
class Params:
    allreduce_frac: float = 0.1
    workers_per_gpu: int = 2
    compute_scale: float = 1.0


def _terms(st: StageTimes, p: Params, servers: int, ranks: int, gpus: int) -> dict[str, float]:
    """Each stage's seconds with ``servers`` rollout servers and ``ranks`` trainer ranks."""
    k = p.compute_scale
    return {
        "generate": k * st.generate / servers,
        "env": st.env * st.env_workers / (p.workers_per_gpu * gpus),
        "train": k * st.train / ranks,
        "allreduce": k * p.allreduce_frac * st.train * 2 * (ranks - 1) / ranks,
        "orchestration": st.orchestration,
    }


def sync_loop(st: StageTimes, p: Params, gpus: int) -> dict[str, Any]:
    terms = _terms(st, p, gpus, gpus, gpus)
    return {"seconds": sum(terms.values()), "terms": terms, "bottleneck": max(terms, key=terms.get)}


def _async_split(st: StageTimes, p: Params, gpus: int, servers: int) -> dict[str, Any]:
    terms = _terms(st, p, servers, gpus - servers, gpus)
    rollout = terms["generate"] + terms["env"]
    learner = terms["train"] + terms["allreduce"]
    path = ("generate", "env") if rollout >= learner else ("train", "allreduce")
    critical = {"orchestration": terms["orchestration"], **{n: terms[n] for n in path}}
    return {
        "seconds": terms["orchestration"] + max(rollout, learner),
        "terms": terms,
        "rollout_servers": servers,
        "trainer_ranks": gpus - servers,
        "bottleneck": max(critical, key=critical.get),
    }


def async_loop(st: StageTimes, p: Params, gpus: int) -> dict[str, Any]:
    """The best split of ``gpus`` into rollout servers and trainer ranks; one GPU cannot overlap."""
    if gpus == 1:
        return {**sync_loop(st, p, 1), "rollout_servers": 1, "trainer_ranks": 1}
    return min((_async_split(st, p, gpus, r) for r in range(1, gpus)), key=lambda x: x["seconds"])


def scenario(st: StageTimes, p: Params, gpus: tuple[int, ...] = GPUS) -> dict[str, Any]:
    rows = []
    for g in gpus:
        s, a = sync_loop(st, p, g), async_loop(st, p, g)
        rows.append(
            {
                "gpus": g,
                "sync_s": round(s["seconds"], 4),
                "async_s": round(a["seconds"], 4),
                "sync_bottleneck": s["bottleneck"],
                "async_bottleneck": a["bottleneck"],
                "async_split": [a["rollout_servers"], a["trainer_ranks"]],
                "speedup_sync": round(sync_loop(st, p, 1)["seconds"] / s["seconds"], 3),
                "async_over_sync": round(s["seconds"] / a["seconds"], 3),
            }
        )
    return {"params": asdict(p), "rows": rows, "moves": {k: moves(rows, k) for k in ("sync", "async")}}


def moves(rows: list[dict[str, Any]], loop: str) -> str:
    """Where the bottleneck moves with G, e.g. 'train (G=1-4) -> generate (G=8-64)'."""
    spans: list[list[Any]] = []
    for r in rows:
        b = r[f"{loop}_bottleneck"]
        if spans and spans[-1][0] == b:
            spans[-1][2] = r["gpus"]
        else:
            spans.append([b, r["gpus"], r["gpus"]])
    return " -> ".join(f"{b} (G={lo})" if lo == hi else f"{b} (G={lo}-{hi})" for b, lo, hi in spans)


def table(sc: dict[str, Any]) -> str:
    lines = [
        f"{'G':>3} {'sync s':>8} {'bottleneck':>13} {'async s':>8} {'bottleneck':>13} {'split R+T':>9} "
        f"{'async x':>7}"
    ]
    for r in sc["rows"]:
        split = "{}+{}".format(*r["async_split"]) if r["gpus"] > 1 else "shared"
        lines.append(
            f"{r['gpus']:>3} {r['sync_s']:>8.3f} {r['sync_bottleneck']:>13} {r['async_s']:>8.3f} "
            f"{r['async_bottleneck']:>13} {split:>9} {r['async_over_sync']:>7.2f}"
        )
    lines += [f"sync:  {sc['moves']['sync']}", f"async: {sc['moves']['async']}"]
    return "\n".join(lines)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curve", type=Path, default=RESULTS / "demo_curve.json", help="curve JSON to measure")
    for name in ("generate", "env", "train", "orchestration"):
        ap.add_argument(f"--{name}", type=float, help=f"{name} seconds per iteration (overrides --curve)")
    ap.add_argument("--env-workers", type=int, default=2, help="env workers the times were measured with")
    ap.add_argument("--allreduce-frac", type=float, default=0.1, help="all-reduce cost / one-GPU train time")
    ap.add_argument("--workers-per-gpu", type=int, default=2, help="CPU env workers per GPU at scale")
    ap.add_argument(
        "--compute-scale",
        type=float,
        nargs="+",
        default=[1.0, 100.0],
        help="scenarios: multiply the GPU stages by each (1 = as measured)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line last, and save it")
    ap.add_argument("--out", type=Path, help=f"where --json saves (default {OUT})")
    add_smoke_flag(ap)
    return ap.parse_args()


def main() -> None:
    args = _args()
    if args.smoke:
        args.compute_scale = args.compute_scale[:1]
    st = measured(args.curve, args.env_workers)
    given = {k: getattr(args, k) for k in ("generate", "env", "train", "orchestration") if getattr(args, k)}
    if given:
        st = replace(st, **given, source=f"{st.source}; from the command line: {', '.join(given)}")
    print(f"stage seconds per iteration ({st.source}):")
    print("  " + "  ".join(f"{k} {v:.3f}" for k, v in asdict(st).items() if isinstance(v, float)))
    scenarios = []
    for k in args.compute_scale:
        p = Params(args.allreduce_frac, args.workers_per_gpu, k)
        sc = scenario(st, p)
        scenarios.append(sc)
        print(
            f"\ncompute x{k:g}, all-reduce {p.allreduce_frac:g} x train, {p.workers_per_gpu} env workers/GPU:"
        )
        print(table(sc))
    if not args.json:
        return
    last = scenarios[0]["rows"][-1]
    result = {
        "benchmark": "scaleout_model",
        "stage_seconds": asdict(st),
        "scenarios": scenarios,
        "ratio": last["async_over_sync"],
        "ratio_definition": (
            f"modelled iteration time, synchronous / asynchronous loop, at G={last['gpus']} GPUs, "
            f"compute x{args.compute_scale[0]:g} (higher: async gains more)"
        ),
    }
    finish(result, result_file(args.out, OUT, args.smoke), True, args.smoke)


if __name__ == "__main__":
    main()
