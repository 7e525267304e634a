"""The stage body of execute_envs: every episode replayed into a fresh environment, its outcome stored.

Where the environments run is ``task.executor``: inline, a pool of spawned processes held by the run's
context, or Ray tasks (a local cluster on 127.0.0.1, ``task.ray_address``, or the run's
``cluster.ray_address``, where the manifest's ``placement`` records the node of each chunk). Rows are cut into
chunks that keep their order, so all three give the same table. A user's environment package that is not
installed on the Ray cluster is uploaded with the job (``runtime_env`` ``py_modules``, fixed when the process
first joins the cluster); spawned processes import it from the parent's ``sys.path``.

    out = env_outcomes(ctx, rollouts)   # one row per rollout row: prompt_index, sample_index, done, outcome
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Any

import pandas as pd

from envs.base import BatchSteps, StepResult, check_outcome, make_env
from rl_core.artifacts.images import digest
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.run.cluster import Probe, connect
from rl_core.run.context import RunContext

log = logging.getLogger("rlfoundry.envs")


def final_of(res: StepResult) -> str:
    """How a step left its episode: ``correct`` or ``incorrect`` when it ended it, else ``open`` (the episode
    goes on, or was cut off after it: at ``max_turns`` or by the context). Stored with each multi-turn
    rollout (``final``): its replay must end the same way.

    >>> final_of(StepResult(None, True, {"correct": 1.0})), final_of(StepResult("more", False))
    ('correct', 'open')
    """
    return ("correct" if res.outcome.get("correct") else "incorrect") if res.done else "open"


def outcomes_for(
    env_name: str, env_args: dict[str, Any], rows: list[dict[str, Any]], tasks: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each row's outcome from a fresh environment (pure: runs in any worker process or Ray task), checked
    against the ``Outcome`` record (an outcome without ``correct`` or ``well_formed`` is an error here).

    Multi-turn rows are replayed from their stored actions, and every observation the environment gives is
    checked against the one the model saw: a difference (a non-hermetic environment) sets ``replay_mismatch``.
    An environment that scores a batch at once (``BatchSteps``, e.g. one sandbox-pool call for every
    completion) gets the single-turn rows in one call.
    """
    batch = make_env(env_name, env_args)
    if isinstance(batch, BatchSteps) and not any("actions" in r for r in rows):
        results = batch.step_many([(tasks[r["task_id"]], r["completion_text"]) for r in rows])
        return [
            {"prompt_index": int(r["prompt_index"]), "sample_index": int(r["sample_index"]), "done": res.done}
            | check_outcome(env_name, res.outcome)
            for r, res in zip(rows, results, strict=True)
        ]
    out = []
    for r in rows:
        env = make_env(env_name, env_args)
        env.reset(tasks[r["task_id"]], int(r["seed"]))
        key = {"prompt_index": int(r["prompt_index"]), "sample_index": int(r["sample_index"])}
        if "actions" not in r:
            res = env.step(r["completion_text"])
            out.append({**key, "done": res.done, **check_outcome(env_name, res.outcome)})
            continue
        mismatch, res = False, None
        seen = list(r["observations"])
        shown = list(r.get("images") or [])[1:]  # each observation's image digests (the prompt's first)
        for j, action in enumerate(r["actions"]):
            res = env.step(str(action))
            if j < len(seen) and (res.observation or "") != seen[j]:
                mismatch = True
            if j < len(shown) and [digest(b) for b in res.images] != list(shown[j]):
                mismatch = True  # the same words over another picture
            if res.done:
                break
        # the episode ends where and as it did when generated (its ``final``; rows stored before it have none)
        if res is not None and r.get("final") is not None:
            early = res.done and j + 1 < len(r["actions"])
            mismatch = mismatch or early or final_of(res) != r["final"]
        outcome = {**(res.outcome if res else {}), "truncated": not (res and res.done)}
        if res is not None and res.done:
            check_outcome(env_name, outcome)
        out.append(
            {
                **key,
                "done": bool(res and res.done),
                "turns": int(r["turns"]),
                "replay_mismatch": mismatch,
                **outcome,
            }
        )
    return out


def _process_pool(ctx: RunContext) -> Any:
    """The run's environment process pool, held by its context (spawned: safe beside the rollout engine's
    threads)."""
    if ctx.held.env_pool is None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        from envs.sandbox.pool import exit_with_parent

        ctx.held.env_pool = ProcessPoolExecutor(
            ctx.cfg.task.env_workers, mp_context=mp.get_context("spawn"), initializer=exit_with_parent
        )
    return ctx.held.env_pool


class _EnvWorker(Probe):
    """An environment worker in a Ray actor's process: lives as long as the run's context, so no stage waits
    for a worker process to start (Ray stops idle task workers while the train stage holds the CPUs)."""

    def outcomes(
        self, env: str, env_args: dict[str, Any], rows: list[dict[str, Any]], tasks: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        return outcomes_for(env, env_args, rows, tasks)


@dataclass
class RayWorkers:
    """The run's environment actors and where each is; ``shutdown`` as a process pool's (``Held.close``)."""

    workers: list[Any]
    where: list[dict[str, Any]]

    def shutdown(self, cancel_futures: bool = True) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)


def _ray_workers(ctx: RunContext, address: str) -> RayWorkers:
    """The run's ``task.env_workers`` environment actors (a CPU each, spread over the nodes), started on
    first use and held by the context: on ``address``'s cluster, or a single-node cluster of the run's own on
    127.0.0.1 (never one it happens to find: RAY_ADDRESS, a `ray start` on this machine)."""
    import ray

    if ctx.held.env_pool is not None:
        return ctx.held.env_pool
    tc = ctx.cfg.task
    own = {"num_cpus": tc.env_workers, "include_dashboard": False, "_node_ip_address": "127.0.0.1"}
    connect(address or "local", tc.env, **({} if address else own))
    actor = ray.remote(num_cpus=1, max_restarts=0)(_EnvWorker)
    workers = [actor.options(scheduling_strategy="SPREAD").remote() for _ in range(tc.env_workers)]
    ctx.held.env_pool = RayWorkers(workers, ray.get([w.where.remote() for w in workers]))
    return ctx.held.env_pool


def _ray_map(
    ctx: RunContext, address: str, chunks: list[list[dict[str, Any]]], tasks: dict[str, dict[str, Any]]
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Chunk i to worker i mod n (each worker runs its chunks in order); the outcomes in chunk order, and
    where each chunk ran."""
    import ray

    pool = _ray_workers(ctx, address)
    workers, where = pool.workers, [{"node": w["node"], "address": w["address"]} for w in pool.where]
    tc, n = ctx.cfg.task, len(workers)
    tasks_ref = ray.put(tasks)
    refs = [workers[i % n].outcomes.remote(tc.env, tc.env_args, c, tasks_ref) for i, c in enumerate(chunks)]
    try:
        parts = ray.get(refs)
    except ray.exceptions.RayActorError:
        ctx.held.env_pool = None  # the next stage starts its workers afresh
        raise RuntimeError(
            f"environment workers on the Ray cluster {address or '(local)'}: a worker died (node lost or "
            "process killed); nothing committed"
        ) from None
    placed = [{"chunk": i, "rows": len(c), **where[i % n]} for i, c in enumerate(chunks)]
    return parts, placed


def env_outcomes(ctx: RunContext, df: pd.DataFrame) -> pd.DataFrame:
    """Outcomes of every row, in row order.

    Computed where ``task.executor`` says: inline, a local process pool, or Ray."""
    tc = ctx.cfg.task
    cols = [
        c
        for c in (
            "prompt_index",
            "sample_index",
            "task_id",
            "seed",
            "completion_text",
            "actions",
            "observations",
            "turns",
            "images",
        )
        if c in df.columns
    ]
    rows = df[cols].to_dict("records")
    for r in rows:
        for c in ("actions", "observations"):
            if c in r:
                r[c] = [str(x) for x in r[c]]
        if "images" in r:  # plain lists (parquet gives arrays): picklable to any worker
            r["images"] = [[str(d) for d in turn] for turn in r["images"]]
    tasks = {t["task_id"]: t for t in ctx.train_tasks + ctx.heldout_tasks}
    needed = {r["task_id"] for r in rows}
    tasks = {k: v for k, v in tasks.items() if k in needed}
    if tc.executor == "inline" or len(rows) < 2:
        return pd.DataFrame(outcomes_for(tc.env, tc.env_args, rows, tasks))
    n_chunks = max(1, min(len(rows), tc.env_workers * 4))
    size = -(-len(rows) // n_chunks)
    chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
    if tc.executor == "ray":  # task.ray_address, else the run's cluster, else a local one of its own
        address = tc.ray_address or ctx.cfg.cluster.ray_address
        parts, where = _ray_map(ctx, address, chunks, tasks)
        out = pd.DataFrame([o for part in parts for o in part])
        out.attrs["placement"] = {"ray_address": address, "env_workers": where}
        return out
    parts = _pool_map(ctx, chunks, tasks)
    return pd.DataFrame([o for part in parts for o in part])


def _ended(pool: Any) -> str:
    """How the pool's worker processes ended: the signal or exit code of each that did."""
    how = []
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        code = p.exitcode
        if code is not None and code != -signal.SIGTERM:  # SIGTERM: the executor ending the others
            how.append(f"pid {p.pid}: {signal.Signals(-code).name if code < 0 else f'exit code {code}'}")
    return ", ".join(how) or "no exit status kept"


class _WorkerDied(Exception):
    """A worker of the run's process pool ended while it held chunks; the message is how it ended."""


def _map_once(ctx: RunContext, chunks: list[list[dict[str, Any]]], tasks: dict[str, Any]) -> list[Any]:
    from concurrent.futures.process import BrokenProcessPool

    tc, n = ctx.cfg.task, len(chunks)
    pool = _process_pool(ctx)
    try:
        return list(pool.map(outcomes_for, [tc.env] * n, [tc.env_args] * n, chunks, [tasks] * n))
    except BrokenProcessPool:
        how = _ended(pool)
        ctx.held.env_pool = None  # the next call starts a fresh pool
        pool.shutdown(wait=True, cancel_futures=True)
        raise _WorkerDied(how) from None


def _pool_map(ctx: RunContext, chunks: list[list[dict[str, Any]]], tasks: dict[str, Any]) -> list[Any]:
    """The chunks' outcomes from the run's process pool. A worker that dies (the kernel's OOM killer, a crash
    in native code) breaks the pool: the chunks run again, once, on a fresh one (outcomes are pure, so the
    table is the same); a second death is an error naming the environment and how its workers ended."""
    env = ctx.cfg.task.env
    try:
        return _map_once(ctx, chunks, tasks)
    except _WorkerDied as died:
        log.warning("environment %r: a worker died (%s); its chunks run again on a fresh pool", env, died)
    try:
        return _map_once(ctx, chunks, tasks)
    except _WorkerDied as died:
        raise RuntimeError(
            f"environment {env!r}: a worker process of task.executor=process died twice ({died}); SIGKILL "
            "is most often the kernel's OOM killer (fewer task.env_workers), SIGSEGV a crash in the "
            "environment's native code; nothing committed"
        ) from None


def execute_envs_body(ctx: RunContext, job: StageJob) -> StageResult:
    df = ctx.store.read_table(job.inputs["rollouts"])
    out = env_outcomes(ctx, df)
    placement = out.attrs.pop("placement", None)  # not in the table: its bytes are the same wherever it ran
    ref = ctx.store.write_table(f"{job.out_uri}/env_results.parquet", out)
    metrics = {"well_formed": float(out["well_formed"].mean()), "correct": float(out["correct"].mean())}
    if placement is not None:  # Ray: the node each chunk of environments ran on
        metrics["placement"] = placement
    if "sandbox_s" in out:  # environments that run code report the sandbox time of each episode
        metrics["sandbox_s"] = float(out["sandbox_s"].sum())
    if "hedge" in out:  # verifiers that pay one committed value: the share of answers that offered several
        metrics["hedged"] = float((out["hedge"].fillna("") != "").mean())
    return StageResult(outputs={"env_results": ref}, metrics=metrics)
