"""Benchmarks cannot rot: every script in benchmarks/ runs its ``--smoke`` mode here (its own code on the
smallest shape, one step per arm; ``benchmarks/common.py``), so a change that breaks a benchmark fails the
suite instead of the next measurement.

Each smoke is ``python benchmarks/NAME.py --smoke --json`` in a subprocess from the project root, with its own
state dir and the session's Prefect server (``cli_env``). It must exit 0 and print as its last line one JSON
object marked ``"smoke": true`` with the machine and a numeric ``ratio``, and leave benchmarks/results/ as it
was; the runs it made are in its own state dir and none of them in the project's .state/ (asserted on the
smoke's own run ids: other rlfoundry processes may use .state/ meanwhile). A new script in benchmarks/
without an entry here fails ``test_every_benchmark_has_a_smoke``.

    .venv/bin/pytest -q tests/integration/test_benchmarks_smoke.py
"""

from __future__ import annotations

import hashlib
import json
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli_env, run_script

BENCHMARKS = ROOT / "benchmarks"
# helpers (the GPU check's bare peer included), and the adversarial suite's corpus
NOT_BENCHMARKS = {"__init__", "common", "gpu_bare", "reward_exploits"}

# Every benchmark script; each smoke is a process of its own (a fork-server child), so all are marked slow.
SMOKES: tuple[str, ...] = (
    "async",
    "checkpoint_cadence",
    "code_curve",
    "curriculum",
    "engine_start",
    "gpu_check",
    "head_stats",
    "hf_generate",
    "judge",
    "lineage_short_runs",
    "lineage_writes",
    "logprob_head",
    "miniwob_curve",
    "miniwob_env",
    "orchestration",
    "packing",
    "page_cache",
    "pg_family",
    "pixel_norm",
    "plot_curve",
    "prefect_server",
    "reasoning_gym_curve",
    "reward_audit",
    "reward_server",
    "rollout",
    "sandbox",
    "scaleout_model",
    "server_start",
    "summary_window",
    "train_layouts",
    "train_step",
    "vs_trl",
    "weight_sync",
    "write_behind",
)

# Ratios defined by a held-out gain (iterations or seconds to it, a gain over GRPO's, a pass rate over the
# base's): after one step from a 20-step warm-up the gain may not be there, and the benchmark's own
# definition makes the ratio null. For these, the figures of every arm must be there instead.
GAIN_RATIOS: dict[str, list[str]] = {
    "code_curve": ["curve", "base_pass_rate", "final_pass_rate"],
    # every figure with the bare peer's ratio beside it (issue 38's result keys)
    "gpu_check": ["vs_bare.generate", "vs_bare.update_padded", "vs_bare.update_packed", "packed_over_padded"],
    "miniwob_curve": ["curve", "tasks", "rise_points"],
    "reasoning_gym_curve": ["curve", "base_accuracy", "final_accuracy"],
    "curriculum": ["workloads.default.none.curve", "workloads.default.frontier.curve"],
    "pg_family": ["curves.grpo.heldout", "curves.ppo.heldout"],
    "vs_trl": ["workloads.default.rlfoundry_sync.clock_s", "workloads.default.base_accuracy"]
    + (["workloads.default.trl.clock_s"] if find_spec("trl") else ["workloads.default.trl.skipped"]),
}


def dig(obj: object, dotted: str) -> object:
    """``obj["a"]["b"]`` for ``"a.b"``; None where a key is missing.

    >>> dig({"a": {"b": [1]}}, "a.b"), dig({"a": {}}, "a.b")
    ([1], None)
    """
    for key in dotted.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def files(folder: Path) -> dict[str, tuple[str, int]]:
    """The sha256 and mtime of every file under ``folder`` (the results folder: small)."""
    found = sorted(p for p in folder.rglob("*") if p.is_file())
    return {
        p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in found
    }


def runs_in(state: Path) -> set[str]:
    """The run ids in a state dir's store (not the shared base models, keyed by config)."""
    store = state / "store"
    return {p.name for p in store.iterdir() if p.is_dir() and p.name != "_base"} if store.is_dir() else set()


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in NOT_BENCHMARKS)


# Smokes that run inside another test, which needs the same runs (no second copy in the suite's budget).
SMOKED_ELSEWHERE = {"cluster": "tests/integration/test_ray_cluster.py"}


@pytest.mark.parametrize("name", scripts())
def test_every_benchmark_has_a_smoke(name: str) -> None:
    if name in SMOKED_ELSEWHERE:
        smoked_by = (ROOT / SMOKED_ELSEWHERE[name]).read_text()
        assert f"benchmarks/{name}.py" in smoked_by and '"--smoke"' in smoked_by, SMOKED_ELSEWHERE[name]
        return
    assert name in SMOKES, f"benchmarks/{name}.py has no smoke here: give it --smoke and an entry in SMOKES"


@pytest.mark.parametrize(
    "bench",
    [pytest.param(n, marks=[pytest.mark.slow]) for n in SMOKES],  # each a process of its own
)
def test_benchmark_smoke(bench: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    # Two torch threads per process on two shared cores made a 20-step warm-up take 44 s, not 0.6 s, while
    # OpenMP threads spun waiting on each other: the suite's OMP_WAIT_POLICY=PASSIVE (tests/conftest.py) stops
    # the spinning. (OMP_NUM_THREADS=1 is no option for a fork server's child, whose OpenMP runtime kept the
    # server's thread count: vLLM's CPU attention refused the mismatch.)
    env = cli_env(state)  # vLLM caches in the machine's folder (rl_core.artifacts.paths.vllm_cache_root)
    before = files(BENCHMARKS / "results")
    # a child of the fork server (tests/forkserver.py): the script's own process, its imports done once
    done = run_script(f"benchmarks/{bench}.py", ["--smoke", "--json"], env, timeout=840)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["smoke"] is True
    assert result["machine"]["cpu_count"] and result["machine"]["versions"]["torch"]
    assert result["ratio"] is None or isinstance(result["ratio"], int | float), result["ratio"]
    if bench in GAIN_RATIOS:
        missing = [k for k in GAIN_RATIOS[bench] if dig(result, k) in (None, [], {})]
        assert not missing, f"{bench}: no {missing} in the result"
    else:
        assert result["ratio"] is not None
    assert files(BENCHMARKS / "results") == before, "a smoke changed benchmarks/results/"
    # What the smoke wrote is its own: run ids made for it, which no other process makes at the same time
    # (unlike a listing of the shared .state/, which any rlfoundry process may change meanwhile).
    leaked = sorted(r for r in runs_in(state) if (ROOT / ".state" / "store" / r).exists())
    assert not leaked, f"a smoke wrote runs into the project's .state/: {leaked}"
