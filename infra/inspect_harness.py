"""inspect-ai tasks (``eval.inspect``) against a checkpoint: the evaluation harness the field uses, run from
its own environment (its fsspec pin clashes with the project's), talking to a vLLM server of rlfoundry's.

For each task the checkpoint is served by one ``RolloutServers`` process (127.0.0.1, the bearer token of
infra/rollout_auth.py, the run's engine settings); ``inspect eval`` runs in the harness's environment against
it as an OpenAI-compatible endpoint (the chat route when the tokenizer has a chat template, else the
completions route), greedy by default and seeded from the run's seed and the task's name. Its JSON log is
stored beside the dataset it read, so the scores keep their lineage: the stage's manifest names the
checkpoint (by digest) it measured, the log names every sample, prompt and answer.

The environment is ``~/.cache/rlfoundry/venvs/inspect-<hash of infra/inspect/requirements.txt>``, made on
first use (with uv when installed, else pip) under a file lock, and reused by every run after.

    served = Served(ctx, ckpt_ref)         # the server starts with the first task
    result = served.run(StageJob(k, {"policy": ckpt_ref}, out_uri), "qa")
    result.metrics["inspect.qa.match.accuracy"]
    served.close()
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from infra.localstack.process import clean_env
from rl_core.artifacts.paths import PROJECT_ROOT, cache_dir, state_dir
from rl_core.artifacts.seeding import derive_seed
from rl_core.artifacts.stage import StageJob, StageResult, run_stage
from rl_core.run.context import RunContext
from rl_core.schema.config_eval import BUILTIN_INSPECT_TASKS

HARNESS = PROJECT_ROOT / "infra" / "inspect"
LOCK = HARNESS / "requirements.txt"
BUILTIN_TASKS = {name: HARNESS / f"{name}_task.py" for name in BUILTIN_INSPECT_TASKS}
SERVICE = "rlfoundry"  # inspect-ai's openai-api provider reads RLFOUNDRY_BASE_URL and RLFOUNDRY_API_KEY


class HarnessError(RuntimeError):
    """The harness could not be installed, or a task failed; the message names the task and why."""


def harness_python(lock: Path = LOCK) -> Path:
    """The interpreter of the harness's environment, made from ``lock`` on first use (a half-made one, from
    an interrupted install, is made again)."""
    from filelock import FileLock

    root = cache_dir("venvs") / f"inspect-{hashlib.sha256(lock.read_bytes()).hexdigest()[:12]}"
    python = root / "bin" / "python"
    with FileLock(f"{root}.lock"):
        if (root / ".complete").exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        uv = importlib.util.find_spec("uv") is not None
        steps = [[sys.executable, "-m", "venv", *(["--without-pip"] if uv else []), str(root)]]
        if uv:
            steps.append(
                [sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(python), "-r", str(lock)]
            )
        else:
            steps.append([str(python), "-m", "pip", "install", "-q", "-r", str(lock)])
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
            if done.returncode != 0:
                raise HarnessError(
                    f"installing the inspect-ai environment ({lock}) failed: {' '.join(cmd[:6])} ... exited "
                    f"{done.returncode}: {done.stderr[-1500:]}"
                )
        (root / ".complete").touch()
    return python


def task_target(name: str, task: str) -> tuple[Path, str]:
    """Where and what ``inspect eval`` runs for ``eval.inspect.NAME.task`` (it takes a task file relative to
    its working directory): a built-in task's file, or the user's ``FILE.py[@TASK]`` (resolved from this
    working directory; a missing file is an error naming the field)."""
    if task in BUILTIN_TASKS:
        return BUILTIN_TASKS[task].parent, BUILTIN_TASKS[task].name
    file, _, fn = task.partition("@")
    path = Path(file).resolve()
    if path.suffix != ".py" or not path.is_file():
        raise HarnessError(
            f"eval.inspect.{name}.task: {task!r} is neither a built-in task ({', '.join(BUILTIN_TASKS)}) nor "
            "an existing FILE.py[@TASK]"
        )
    return path.parent, f"{path.name}@{fn}" if fn else path.name


def write_heldout(tasks: list[dict[str, Any]], path: Path) -> Path:
    """The held-out problems as the ``qa`` task reads them: JSON lines of id, input (prompt) and target."""
    lines = [
        json.dumps({"id": t["task_id"], "input": t["prompt"], "target": str(t["answer"])}) for t in tasks
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def scores(name: str, log: dict[str, Any]) -> dict[str, float]:
    """``inspect.NAME.<scorer>.<metric>`` and ``inspect.NAME.samples`` from an inspect-ai JSON log; a log that
    did not succeed is an error quoting its own.

    >>> scores("qa", {"status": "success", "results": {"completed_samples": 4, "scores": [
    ...     {"name": "match", "metrics": {"accuracy": {"value": 0.25}, "stderr": {"value": 0.25}}}]}})
    {'inspect.qa.samples': 4, 'inspect.qa.match.accuracy': 0.25, 'inspect.qa.match.stderr': 0.25}
    """
    if log.get("status") != "success":
        why = (log.get("error") or {}).get("message", "no error recorded")
        raise HarnessError(f"eval.inspect.{name}: inspect-ai ended with status {log.get('status')!r}: {why}")
    results = log["results"]
    out: dict[str, float] = {f"inspect.{name}.samples": results["completed_samples"]}
    for score in results["scores"]:
        for metric, m in score["metrics"].items():
            out[f"inspect.{name}.{score['name']}.{metric}"] = m["value"]
    return out


def run_task(
    name: str,
    spec: Any,
    *,
    url: str,
    token: str,
    chat: bool,
    dataset: Path,
    seed: int,
    max_tokens: int,
    logs: Path,
) -> tuple[Path, dict[str, float]]:
    """``inspect eval`` of task ``name`` (``spec``: its InspectTask) against the server at ``url``: the log
    file and its scores."""
    provider = "openai-api" if chat else "openai-api-completions"
    cwd, target = task_target(name, spec.task)
    cmd = [
        str(harness_python()),
        *("-m", "inspect_ai", "eval", target),
        *("--model", f"{provider}/{SERVICE}/policy", "--log-dir", str(logs), "--log-format", "json"),
        *("--display", "none", "--seed", str(seed), "--temperature", str(spec.temperature)),
        *("--max-tokens", str(max_tokens), "-T", f"dataset={dataset}"),
        *(a for k, v in spec.args.items() for a in ("-T", f"{k}={v}")),
        *(("--limit", str(spec.limit)) if spec.limit else ()),
    ]
    env = clean_env(RLFOUNDRY_BASE_URL=f"{url}/v1", RLFOUNDRY_API_KEY=token, INSPECT_LOG_LEVEL="warning")
    for k in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):  # the harness's environment, not this one's
        env.pop(k, None)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=spec.timeout_s)
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"eval.inspect.{name}: inspect eval ran past timeout_s={spec.timeout_s}") from e
    found = sorted(logs.glob("*.json"))
    if done.returncode != 0 or not found:
        raise HarnessError(
            f"eval.inspect.{name}: inspect eval exited {done.returncode}: "
            f"{(done.stderr or done.stdout)[-2000:]}"
        )
    return found[-1], scores(name, json.loads(found[-1].read_text(encoding="utf-8")))


class Served:
    """One checkpoint served for inspect-ai tasks: the server starts at the first task that needs it (a task
    the sweep reuses starts none) and serves every task after it, until ``close``."""

    def __init__(self, ctx: RunContext, policy: Any):
        self.ctx, self.policy = ctx, policy
        self.servers: Any = None
        self.url = ""

    def _start(self) -> Path:
        from infra.rollout_servers import RolloutServers
        from rl_core.models.placement import engine_dtype

        ckpt = self.ctx.local_checkpoint(self.policy)
        if self.servers is None:
            self.servers = RolloutServers(
                ckpt,
                self.ctx.cfg.rollout,
                max_model_len=self.ctx.max_model_len(),
                dtype=engine_dtype(self.ctx.cfg),
                placement=self.ctx.placement,
                logs=state_dir() / "logs",
            )
            (self.url,) = self.servers.start(1)
        return ckpt

    def run(self, job: StageJob, name: str, spec: Any = None) -> StageResult:
        """Task ``name`` of ``eval.inspect`` (or ``spec``, an InspectTask) against the checkpoint (the
        job's ``policy``); its log and dataset stored under ``job.out_uri``."""
        from rl_core.models.model import has_chat_template, load_tokenizer

        ctx, spec = self.ctx, spec or self.ctx.cfg.eval.inspect[name]
        seed = derive_seed(ctx.cfg.experiment.seed, "inspect", name)
        with tempfile.TemporaryDirectory() as d:
            if spec.dataset == "heldout":
                dataset = write_heldout(ctx.heldout_tasks, Path(d) / "heldout.jsonl")
            else:
                dataset = Path(spec.dataset).resolve()
                if not dataset.is_file():
                    raise HarnessError(f"eval.inspect.{name}.dataset: no file {spec.dataset}")
            ckpt = self._start()
            chat = spec.api == "chat" or (spec.api == "auto" and has_chat_template(load_tokenizer(ckpt)))
            (Path(d) / "logs").mkdir()
            log, metrics = run_task(
                name,
                spec,
                url=self.url,
                token=self.servers.token,
                chat=chat,
                dataset=dataset,
                seed=seed,
                max_tokens=spec.max_tokens or ctx.cfg.rollout.max_tokens,
                logs=Path(d) / "logs",
            )
            outputs = {
                "log": ctx.store.write_bytes(f"{job.out_uri}/inspect-log.json", log.read_bytes()),
                "dataset": ctx.store.write_bytes(
                    f"{job.out_uri}/dataset{dataset.suffix}", dataset.read_bytes()
                ),
            }
        api = {f"inspect.{name}.api": "chat" if chat else "completions", f"inspect.{name}.task": spec.task}
        return StageResult(outputs=outputs, metrics={**metrics, **api}, seeds={"inspect": seed})

    def close(self) -> None:
        if self.servers is not None:
            self.servers.stop()
            self.servers = None


def sweep_hash(run_hash: str, spec: Any) -> str:
    """The hash a sweep's inspect stage is committed under: the run's stage hash and the task's own settings
    (``eval.inspect`` is left out of the run's hash), so a changed task is measured again, never reused."""
    from rl_core.schema.config import config_hash

    return config_hash({"run": run_hash, "inspect": spec.model_dump(mode="json")})


def sweep_tasks(ctx: Any, rid: str, k: int, ckpt: Any, tasks: dict[str, Any]) -> dict[str, Any]:
    """The inspect-ai ``tasks`` due at checkpoint ``k`` (each task's ``every``, and always the run's last),
    each committed once under ``<run>/sweep/iter-K/inspect-NAME`` (its hash: the run's and the task's
    settings), on one server of the checkpoint started for the first task not committed yet: their scores."""
    last = ctx.cfg.experiment.iterations
    out: dict[str, Any] = {}
    served = Served(ctx, ckpt)
    try:
        for name, spec in tasks.items():
            if k % spec.every and k != last:
                continue
            m = run_stage(
                ctx.store,
                f"{rid}/sweep",
                k,
                f"inspect-{name}",
                sweep_hash(ctx.config_hash, spec),
                {"policy": ckpt},
                lambda job, n=name, t=spec: served.run(job, n, t),
            )
            out |= {key: v for key, v in m.metrics.items() if key.startswith("inspect.")}
    finally:
        served.close()
    return out


def scores_cell(scores: dict[str, Any]) -> str:
    """The inspect-ai accuracies of one checkpoint, for the sweep's table.

    >>> scores_cell({"accuracy": 0.5, "inspect.qa.match.accuracy": 0.25, "inspect.qa.samples": 8})
    'qa.match.accuracy 0.250'
    """
    return ", ".join(
        f"{k.removeprefix('inspect.')} {v:.3f}" for k, v in scores.items() if k.endswith(".accuracy")
    )
