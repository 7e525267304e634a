"""Computer use from pixels learns: configs/miniwob.yaml end to end, held-out success per MiniWoB++ task.

    .venv/bin/python benchmarks/miniwob_curve.py --json [--iterations 30] [--set key=value ...]
    .venv/bin/python benchmarks/miniwob_curve.py --smoke --json   # a tiny policy, 1 iteration, writes nowhere

The policy is the built-in Idefics3 (SmolVLM-architecture) one ``init`` builds at random init with no
``model.path`` (``rl_core.models.idefics3``: the ``model`` section's sizes, a character-level tokenizer, the
PIL image processor cutting each 160x210 screenshot into 2x2 crops and the global image, 20 image tokens,
its pixels normalized by the training pages' screens). The run (``configs/miniwob.yaml``) warms it up on the
DOM oracle's episodes, a share of them flawed, then trains it with GRPO on the vLLM engine against the
pages' own rewards; its held-out tasks are unseen page seeds.

Writes ``benchmarks/results/miniwob_curve.json`` and ``.png``:
- ``tasks``: each task's held-out greedy success after the warm-up (``warmup``, the base model's evaluation)
  and after RL (``rl``, the last evaluation);
- ``tasks`` also holds ``warmup_actions`` and ``rl_actions`` (``fixed_actions``): whether the greedy policy
  reads the page, as the number of distinct actions it took at each of the first two turns over the task's
  held-out pages (1: the same click whatever the page shows);
- ``curve``: per iteration the wall seconds, stage timings, mean training reward and, where evaluated, the
  held-out success overall and per task;
- ``env_episodes_per_s``: episodes per second of the environment stage (execute_envs replays every episode
  of the iteration in its browser pool).

The last line (``--json``): the raw figures, the machine and versions, and ``ratio`` = mean held-out success
over the tasks after RL / after the warm-up.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.code_curve import curve_args, curve_rows, run  # noqa: E402
from benchmarks.common import finish, result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "miniwob.yaml"
OUT = ROOT / "benchmarks" / "results" / "miniwob_curve.json"


# --smoke: the script's own code on the smallest run (a 2-block policy, two warm-up steps, one iteration of
# 4 x 2 episodes of up to 2 turns, on the HF engine: no vLLM start)
SMOKE_SETS = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.vision_layers=1",
    "warmup.steps=2",
    "warmup.batch_size=4",
    "warmup.examples=8",
    "task.train_size=10",
    "task.heldout_size=10",
    "task.env_args.max_turns=2",
    "rollout.prompts_per_iteration=4",
    "rollout.n=2",
    "eval.every=1",
    "tracking.enabled=false",
    "rollout.engine=hf",  # the run itself is tests/integration/test_miniwob.py's, on vLLM
]


def policy(cfg: Any, run_id: str) -> dict[str, Any]:
    """The built-in policy's shape and the pixel normalization its init measured (from the base's folder)."""
    import json

    from rl_core.run.context import RunContext, base_id

    m, ctx = cfg.model, RunContext(cfg, run_id)
    init = ctx.store.read_manifest(ctx.store.stage_uri(base_id(cfg), 0, "init"))
    assert init is not None, "the run's base has no init stage"
    folder = ctx.local_checkpoint(init.outputs["checkpoint"])
    images = json.loads((Path(folder) / "processor_config.json").read_text())["image_processor"]
    return {
        "family": "idefics3",
        "built_in": True,
        "text": [m.hidden_size, m.num_layers],
        "vision": [m.vision_hidden_size, m.vision_layers],
        "longest_edge": images["size"]["longest_edge"],
        "image_mean": images["image_mean"],
        "image_std": images["image_std"],
    }


def per_task(events: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Each evaluated iteration's held-out success per task (the evaluate stage's ``accuracy_<task>``)."""
    out = {}
    for ev in events:
        if ev.get("eval"):
            got = {m[len("accuracy_") :]: v for m, v in ev["eval"].items() if m.startswith("accuracy_")}
            out[ev["iteration"]] = got
    return out


_TURN_END = re.compile(r"<end_of_utterance>|\nUser:")


def actions(completion: str) -> tuple[str, ...]:
    """The policy's own turns of an episode's completion (Idefics3's chat template: each turn after the first
    follows "Assistant:" and ends at ``<end_of_utterance>``); the observations between them are left out.

    >>> actions('click(1,2)<end_of_utterance>\\nUser:<image>error<end_of_utterance>\\nAssistant:ck(3')
    ('click(1,2)', 'ck(3')
    """
    return tuple(_TURN_END.split(turn, maxsplit=1)[0].strip() for turn in completion.split("Assistant:"))


def fixed_actions(table: Any, turns: int = 2) -> dict[str, dict[str, Any]]:
    """Whether the policy reads the page, per task of an evaluate stage's table (``eval.parquet``): for each
    of the first ``turns`` turns, over the task's held-out pages that reached it, how many distinct actions
    the greedy policy took and the share of them that took the most common one (1.0 on pages that differ:
    the same action whatever the page shows).

    >>> import pandas as pd
    >>> t = pd.DataFrame({"op": ["a", "a", "a"], "greedy_completion": ["click(1,2)", "click(1,2)",
    ...                   "click(3,4)<end_of_utterance>\\nAssistant:key(Enter)"]})
    >>> fixed_actions(t, turns=1)["a"]
    {'pages': 3, 'by_turn': [{'pages': 3, 'distinct': 2, 'most_common': 'click(1,2)', 'share': 0.667}]}
    """
    out: dict[str, dict[str, Any]] = {}
    for task, rows in table.groupby("op"):
        seqs = [actions(c) for c in rows["greedy_completion"]]
        by_turn = []
        for k in range(turns):
            took = [s[k] for s in seqs if len(s) > k]
            if took:
                (top, n), *_ = Counter(took).most_common(1)
                by_turn.append(
                    {
                        "pages": len(took),
                        "distinct": len(set(took)),
                        "most_common": top,
                        "share": round(n / len(took), 3),
                    }
                )
        out[str(task)] = {"pages": len(seqs), "by_turn": by_turn}
    return out


def page_reading(cfg: Any, run_id: str, iterations: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
    """``fixed_actions`` of the evaluate stages of ``iterations`` of the run."""
    from rl_core.run.context import RunContext

    store = RunContext(cfg, run_id).store
    run_uri = store.run_uri(run_id)
    return {
        k: fixed_actions(store.read_table(f"{run_uri}/iter-{k:04d}/evaluate/eval.parquet"))
        for k in iterations
    }


def plot(result: dict[str, Any], out: Path) -> None:
    """Held-out success per task against the iteration (0: after the warm-up)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name in result["tasks"]:
        pts = [(r["iteration"], r["heldout_tasks"][name]) for r in result["curve"] if "heldout_tasks" in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("RL iteration (0: after the warm-up)")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("MiniWoB++ from pixels: Idefics3-architecture policy on vLLM (CPU)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    args, sets = curve_args(__doc__ or "", "miniwob-curve", OUT)
    sets = [*sets, *SMOKE_SETS] if args.smoke else sets
    from rl_core.artifacts.report import subscribe

    def say(ev: dict[str, Any]) -> None:  # the warm-up's and the iterations' progress (tens of minutes)
        if ev["kind"] == "status" or (ev["kind"] == "iteration" and ev.get("eval")):
            print(ev.get("text") or {"iteration": ev["iteration"], "eval": ev["eval"]}, flush=True)

    unsubscribe = subscribe(say)
    try:
        cfg, events = run(sets, args.run_id, CONFIG)
    finally:
        unsubscribe()
    rows = curve_rows(cfg, args.run_id, events)
    success = per_task(events)
    for r in rows:
        if r["iteration"] in success:
            r["heldout_tasks"] = success[r["iteration"]]
    first, last = min(success), max(success)
    tasks = {
        name: {"warmup": success[first].get(name), "rl": success[last].get(name)}
        for name in cfg.task.env_args["tasks"]
    }
    reading = page_reading(cfg, args.run_id, [first, last])
    for name, t in tasks.items():
        t["warmup_actions"], t["rl_actions"] = reading[first].get(name), reading[last].get(name)
    episodes = cfg.rollout.prompts_per_iteration * cfg.rollout.n
    env_s = [r["timings"].get("execute_envs") for r in rows if r["iteration"] >= 1]
    rates = [episodes / s for s in env_s if s]
    warm = [t["warmup"] or 0.0 for t in tasks.values()]
    rl = [t["rl"] or 0.0 for t in tasks.values()]
    result: dict[str, Any] = {
        "benchmark": "miniwob_curve",
        "config": "configs/miniwob.yaml",
        "policy": policy(cfg, args.run_id),
        "engine": cfg.rollout.engine,
        "overrides": sets,
        "tasks": tasks,
        "rise_points": {n: round(100 * ((t["rl"] or 0) - (t["warmup"] or 0)), 1) for n, t in tasks.items()},
        "heldout_problems": cfg.task.heldout_size,
        "env_episodes_per_s": round(sum(rates) / len(rates), 3) if rates else None,
        "wall_s": rows[-1]["wall_s"],
        "ratio": round(sum(rl) / sum(warm), 4) if sum(warm) else None,
        "ratio_definition": "mean held-out success over the tasks after RL / after the warm-up",
        "curve": rows,
    }
    print(
        "held-out success, warm-up -> RL: "
        + ", ".join(
            f"{n} {t['warmup']:.2f} -> {t['rl']:.2f}" for n, t in tasks.items() if t["rl"] is not None
        )
        + f" in {result['wall_s']:.0f} s"
    )
    path = result_file(args.out, OUT, args.smoke)
    if not args.smoke:
        plot(result, path.with_suffix(".png"))
    finish(result, path, args.json, args.smoke)


if __name__ == "__main__":
    main()
