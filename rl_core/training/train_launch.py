"""The train stage as a torchrun job: ``train.world_size`` processes (x ``train.tp_size`` AutoTP), one job per
stage, launched by the flow's train task and committed by it only when every rank has finished.

    launch_train(ctx, job)            # in the flow: runs the job, returns the StageResult of rank 0
    python -m rl_core.training.train_launch rank STORE_ROOT JOB_URI    # what torchrun starts on each rank

Each rank reads the run's config and the stage's inputs from the job file in the store, reads the iteration's
rollouts from the store (``rl_core.training.ppo.ppo_update`` takes its share of every mini-batch), loads the
policy and the world-size-free optimizer state (``rl_core.training.zero_state``), runs the same update as the
in-flow engine, then gathers the whole weights and optimizer state to rank 0, which writes the usual
checkpoint folder, ``optimizer.safetensors`` and the result file (job and result: the stage folder's
``_job/``). The manifest is the flow's: a job that fails commits nothing, and ``resume`` runs the stage again.

Failure and lifetime: torchrun (``--max-restarts 0``) stops the other ranks as soon as one exits abnormally.
A rank ends with ``os._exit`` once its work is done and its output flushed (``end_rank``): the interpreter's
own teardown is where a native destructor (most likely gloo's threads, for the process groups DeepSpeed
keeps) called "terminate called without an active exception" and aborted rank 1 after the job was finished
(CI, stop 48: the rank's stack showed no Python frame). A job whose rank died of SIGABRT anyway (a native
library's abort during the work) runs once more, its first log kept as ``<log>.aborted.log`` with the
ranks' Python stacks (``PYTHONFAULTHANDLER``); any other failure is final
(a kill -9 of one rank leaves its peer blocked in a collective: torchrun ends it); the flow names the rank
that failed and how, with the tail of the job's log. Every process of the job ends when the one that started
it is gone (the agent watches the flow, each rank watches the agent), so a killed flow leaves no rank behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from rl_core.artifacts.paths import PROJECT_ROOT, free_port, state_dir, torch_extensions_dir

# What vLLM writes into this process's environment (thread binding, LD_PRELOAD) and a launcher's own
# variables: never passed on to the ranks.
_DROP = ("LD_PRELOAD", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TrainJobError(RuntimeError):
    """A launched train stage failed: which rank, how, and where its log is."""


def _env(world_size: int, gpus: tuple[int, ...] = ()) -> dict[str, str]:
    """The ranks' environment; ``gpus``: the trainer's GPUs (rl_core.models.placement), made the only visible
    ones, so that rank r trains on cuda:LOCAL_RANK = the r-th of them and never on the engine's."""
    drop = ("VLLM", "TORCHELASTIC")
    env = {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith(drop)}
    threads = max(1, (os.cpu_count() or 1) // world_size)
    env.update(
        # a rank that dies of a fatal signal (SIGSEGV, SIGABRT from a native library) prints every Python
        # thread's stack into the job's log first: what it was doing is in the failure's tail
        PYTHONFAULTHANDLER="1",
        OMP_NUM_THREADS=str(threads),
        TORCH_EXTENSIONS_DIR=torch_extensions_dir(),
        RLFOUNDRY_STATE_DIR=str(state_dir()),
        PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    if gpus:
        from rl_core.models.vllm_args import cuda_visible

        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(gpus, env)
    return env


def agent_command(ranks: int, own: str) -> list[str]:
    """The torchrun agent of a job of ``ranks`` processes on this machine, its folder ``own`` (``_job``),
    on a fresh rendezvous port; the rank's program follows."""
    agent = [sys.executable, "-m", "rl_core.training.train_launch", "agent", f"--nproc-per-node={ranks}"]
    rendezvous = ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    return [*agent, f"--log-dir={own}", *rendezvous, "--max-restarts=0", "--monitor-interval=0.5"]


def _job(command: Callable[[str], list[str]], env: dict[str, str], log: Path) -> int:
    """Run the torchrun agent ``command(its folder)`` with its output in ``log``; its exit status. The agent's
    folder (torchrun's ``--log-dir``; by default a ``torchelastic_*`` it makes in the temp folder and never
    removes: one a job) is a temporary one, removed after the job."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlfoundry-torchrun-") as own, open(log, "wb") as out:
        proc = subprocess.Popen(command(own), cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:  # interrupted or timed out: the ranks follow the agent
                proc.kill()
                proc.wait()


_ENTRY = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def culprit(text: str) -> tuple[int, int] | None:
    """The rank that failed the job and its exit code (negative: the signal), from torchrun's summary in
    its log: a rank killed by a signal first (not the SIGTERM torchrun ends the others with), then one that
    exited with an error (a peer whose collective failed because that rank was gone raises, and can exit
    before torchrun sees the kill: its "Root Cause" is whichever it observed first), then any.

    >>> culprit("Failures:\\n rank : 1 (local_rank: 1)\\n exitcode : -9 (pid: 8)\\n"
    ...         "Root Cause (first observed failure):\\n rank : 0 (local_rank: 0)\\n exitcode : 1 (pid: 7)")
    (1, -9)
    """
    start = text.rfind("Failures:")
    found = [(int(r), int(c)) for r, c in _ENTRY.findall(text[start:])] if start >= 0 else []
    if not found:
        return None

    def order(entry: tuple[int, int]) -> int:
        code = entry[1]
        return 0 if code < 0 and code != -signal.SIGTERM else 1 if code > 0 else 2

    return min(found, key=order)


def _aborted(log: Path) -> bool:
    """Whether the job failed by a rank ended by SIGABRT (exit code -6)."""
    found = culprit(log.read_text(errors="replace")) if log.exists() else None
    return found is not None and found[1] == -signal.SIGABRT


def _failure(log: Path, iteration: int, world_size: int, rc: int, more: str = "") -> TrainJobError:
    text = log.read_text(errors="replace") if log.exists() else ""
    found = culprit(text)
    if found:
        rank, code = found
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        what = f"rank {rank} of {world_size} {how}"
    else:
        what = f"the job of {world_size} processes exited with code {rc}"
    tail = "\n".join(text.splitlines()[-25:])
    return TrainJobError(
        f"train stage of iteration {iteration}: {what}; nothing committed (log: {log}){more}\n{tail}"
    )


def write_job(ctx: Any, job: Any) -> tuple[str, str]:
    """The stage's job file in the store, beside its outputs (ranks on other nodes read it from there), and
    where rank 0 writes its result: (job URI, result URI)."""
    job_uri, result_uri = f"{job.out_uri}/_job/job.json", f"{job.out_uri}/_job/result.json"
    ctx.store.write_json(
        job_uri,
        {
            "run_id": ctx.run_id,
            "config": ctx.cfg.model_dump(mode="json"),
            "iteration": job.iteration,
            "inputs": {k: v.model_dump(mode="json") for k, v in job.inputs.items()},
            "out_uri": job.out_uri,
            "result": result_uri,
            # the flow's placement: a rank sees only its job's GPUs and must not plan again
            "placement": ctx.placement.as_dict(),
        },
    )
    return job_uri, result_uri


def _log_name(ctx: Any, job: Any) -> str:
    """``train-<run>-iter-<k>.log`` for the run's own stage; a job writing elsewhere (a replay, a check of
    another layout on the same inputs) adds a digest of its output folder, so jobs on the same iteration at
    once never share a log."""
    name = f"train-{ctx.run_id.replace('/', '_')}-iter-{job.iteration:04d}"
    if job.out_uri != ctx.store.stage_uri(ctx.run_id, job.iteration, "train"):
        name += "-" + hashlib.sha256(job.out_uri.encode()).hexdigest()[:8]
    return name + ".log"


def launch_train(ctx: Any, job: Any) -> Any:
    """Run the train stage ``job`` as a torchrun job of ``train.world_size`` ranks; its StageResult."""
    from rl_core.artifacts.stage import StageResult

    tc = ctx.cfg.train
    logs = state_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / _log_name(ctx, job)
    job_uri, result_uri = write_job(ctx, job)

    def command(own: str) -> list[str]:  # a fresh rendezvous port for each attempt
        rank = ["-m", "rl_core.training.train_launch", "rank", ctx.store.root, job_uri]
        return [*agent_command(tc.world_size, own), *rank]

    env = _env(tc.world_size, ctx.placement.trainer_gpus)
    rc = _job(command, env, log)
    if rc != 0 and _aborted(log):
        # A rank ended by SIGABRT from a native library during the work (the one seen at exit is gone:
        # end_rank): the job runs once more, its first log kept beside (with the rank's Python stacks:
        # PYTHONFAULTHANDLER). Nothing was committed and the stage is a function of its stored inputs: the
        # outputs are the same either way.
        first = log.with_suffix(".aborted.log")
        log.replace(first)
        rc = _job(command, env, log)
        if rc != 0:
            raise _failure(log, job.iteration, tc.world_size, rc, f"; a first attempt aborted too ({first})")
    if rc != 0:
        raise _failure(log, job.iteration, tc.world_size, rc)
    result = ctx.store.read_json(result_uri)
    from rl_core.artifacts.manifest import ArtifactRef

    outputs = {k: ArtifactRef.model_validate(v) for k, v in result["outputs"].items()}
    return StageResult(outputs=outputs, metrics=result["metrics"], seeds=result["seeds"])


def _rank(store_root: str, job_uri: str) -> None:
    """One rank of the job: the update, then rank 0 writes the outputs and the result file."""
    import torch.distributed as dist

    from rl_core.artifacts.faults import fault
    from rl_core.artifacts.manifest import ArtifactRef
    from rl_core.artifacts.seeding import derive_seed
    from rl_core.artifacts.stage import StageJob
    from rl_core.artifacts.store import Store
    from rl_core.models.model import weights_digest
    from rl_core.models.placement import Placement
    from rl_core.run.context import RunContext
    from rl_core.schema.config import Config
    from rl_core.training.train import _update, checkpoint_weights, optimizer_file, store_checkpoint
    from rl_core.training.train_engine import init_distributed
    from rl_core.training.zero_state import memory_report

    spec = Store(store_root).read_json(job_uri)
    cfg = Config.model_validate(spec["config"])
    store = Store(store_root, retries=cfg.store.retries, retry_max_wait_s=cfg.store.retry_max_wait_s)
    ctx = RunContext(cfg, spec["run_id"], store)
    # cuda:LOCAL_RANK of the GPUs torchrun's ranks see; a Ray actor sees its own GPU only (index 0)
    index = int(os.environ.get("RLFOUNDRY_DEVICE_INDEX", os.environ["LOCAL_RANK"]))
    ctx.__dict__["placement"] = Placement.from_dict(spec["placement"]).for_rank(index)
    inputs = {k: ArtifactRef.model_validate(v) for k, v in spec["inputs"].items()}
    job = StageJob(spec["iteration"], inputs, spec["out_uri"])
    init_distributed()
    rank = dist.get_rank()
    engine, metrics, _ = _update(ctx, job)  # no extra outputs: train.algorithm=ppo is not launched
    fault(f"train:rank{rank}", job.iteration)  # crash tests: one rank dies while its peers wait on it
    weights = engine.full_weights()
    optimizer = engine.optimizer_state()
    metrics |= memory_report(engine) | {"world_size": cfg.train.world_size, "tp_size": cfg.train.tp_size}
    if rank == 0:
        weights, masters = checkpoint_weights(ctx, job, weights)
        ckpt = store_checkpoint(ctx, job, weights)
        opt = store.write_bytes(f"{job.out_uri}/optimizer.safetensors", optimizer_file(optimizer, masters))
        result = {
            "outputs": {"checkpoint": ckpt.model_dump(mode="json"), "optimizer": opt.model_dump(mode="json")},
            "metrics": {**metrics, "policy_sha256": weights_digest(ckpt.files)},
            "seeds": {"train": derive_seed(cfg.experiment.seed, job.iteration, "train")},
        }
        store.write_json(spec["result"], result)
    dist.barrier()
    dist.destroy_process_group()


def end_rank(work: Callable[[], None]) -> NoReturn:
    """Run a rank's ``work`` and end the process without the interpreter's teardown: exit code 0, or 1 with
    the traceback when it raised, once stdout, stderr and the log handlers are flushed. The teardown is where
    a native library's destructor aborted ("terminate called without an active exception"; most likely
    gloo's threads, still joinable when the process groups DeepSpeed keeps are freed), turning a finished
    job into a rank killed by SIGABRT. Every output of the rank is written and closed before ``work``
    returns."""
    import logging
    import traceback

    code = 0
    try:
        work()
    except SystemExit as stop:  # its own code, as the interpreter would take it
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # noqa: BLE001 -- reported here, as the interpreter would, then exit code 1
        traceback.print_exc()
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def main() -> None:
    from envs.sandbox.pool import exit_with_parent

    role, args = sys.argv[1], sys.argv[2:]
    exit_with_parent()  # the agent ends with the flow, each rank with the agent
    if role == "agent":
        from torch.distributed.run import main as torchrun

        torchrun(args)
    elif role == "rank":
        end_rank(lambda: _rank(*args))
    else:
        raise SystemExit(
            f"usage: python -m rl_core.training.train_launch agent ARGS | rank STORE JOB; got {role!r}"
        )


if __name__ == "__main__":
    main()
