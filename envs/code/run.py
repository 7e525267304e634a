"""Running candidates against their hidden tests in the sandbox pool, a whole batch at once.

    outcomes = run_candidates([(task, completion), ...], CodeConfig())
    outcomes[0]  # {"well_formed": True, "correct": False, "tests_passed": 0.4, "sandbox_s": 0.031, ...}

Threat model (what a completion is, and what keeps it from the reward it did not earn):

- A completion is hostile Python. It never runs on the host: the host only parses it (``ast.parse`` of at
  most ``max_chars`` characters, with warnings silenced) to decide ``well_formed``; a completion that does
  not parse or does not define the function is failed without running.
- Every candidate runs in a sandbox run of its own (``envs/sandbox``: its own namespaces, /proc, tmpfs /work,
  cgroup limits, seccomp, wall-clock timeout) through a pool kept for the process's lifetime (``pool``).
  Candidates never share a run: one that forks a lingering process, fills /work, exhausts memory or loops
  cannot touch another's verdict. (Several candidates in one run, each in a process of its own, would share
  the run's uid, pid namespace, /work and cgroup limits: one could signal or starve another, or rewrite its
  files, and so flip its verdict; the reused container makes a run of its own cost ~10 ms, not worth it.)
  Identical (task, completion) pairs in one batch are run once and share the verdict (a GRPO group often
  repeats a completion); ``sandbox_s`` counts the run once.
- Inside the run the tests are kept from the candidate (``envs/code/harness.py``): the candidate is called in
  a forked runner that never holds the expected outputs or the nonce; the harness compares and prints the
  nonce line last (``envs/nonce.py``), so early exits, forged output, killing the harness, looping and
  reading files (no file holds the tests) all fail.
- Not covered: a completion that computes the right answers is rewarded however it computes them (e.g. a
  lookup table of the visible example passes only that example: the hidden inputs differ); timing and other
  side channels; what the sandbox itself does not cover (its docstring: kernel exploits, shared CPU).
"""

from __future__ import annotations

import ast
import json
import threading
import warnings
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from envs.nonce import new_nonce, nonce_line, verdict
from envs.sandbox import Limits

HARNESS_FILE = Path(__file__).with_name("harness.py")
SANDBOX_LOST = "sandbox: its supervisor was lost"
_POOLS: dict[tuple[int, str], Any] = {}
_POOLS_LOCK = threading.Lock()  # stages may score from two threads at once (asynchronous RL)


@cache
def harness_text() -> str:
    return HARNESS_FILE.read_text()


def defines(source: str, entry: str, max_chars: int) -> str | None:
    """None when ``source`` parses and defines ``entry`` at module level; else why not (a flag).

    >>> defines("def f(x):\\n    return x\\n", "f", 100), defines("def f(x):\\nreturn", "f", 100)
    (None, 'syntax_error')
    >>> defines("def g(x):\\n    return x\\n", "f", 100), defines("x = 1" * 50, "f", 100)
    ('missing_function', 'too_long')
    """
    if len(source) > max_chars:
        return "too_long"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except Exception:  # SyntaxError, and RecursionError/MemoryError on pathological nesting
        return "syntax_error"
    found = any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry for node in tree.body
    )
    return None if found else "missing_function"


def job(task: dict[str, Any], completion: str, nonce: str, cfg: Any) -> dict[str, Any]:
    """The sandbox job that tests ``completion``: the solution and the generic harness as files, the hidden
    tests and the nonce on stdin only."""
    from envs.sandbox.bwrap import PYTHON

    lines = [nonce, task["entry"], str(cfg.test_budget_s), str(len(task["inputs"]))]
    lines += [repr(tuple(args)) for args in task["inputs"]] + [repr(v) for v in task["expected"]]
    return {
        "files": {"solution.py": task["prompt"] + completion + "\n", "main.py": harness_text()},
        "argv": [PYTHON, "-I", "-S", "-B", "main.py"],
        "stdin": ("\n".join(lines) + "\n").encode(),
        "limits": Limits(
            timeout_s=cfg.timeout_s,
            memory_mb=cfg.memory_mb,
            max_procs=cfg.max_procs,
            disk_mb=4,
            output_bytes=16 * 1024,
        ),
    }


def outcome(result: Any, nonce: str, total: int) -> dict[str, Any]:
    """The outcome of one sandbox run of the harness (``total`` hidden tests)."""
    finished, flags = verdict(result, nonce)
    line = nonce_line(result.stdout, nonce) if finished else None
    passed, status = 0, "no_verdict"
    parts = (line or "").split()
    if len(parts) == 3 and parts[0].isdigit() and parts[1] == str(total):
        passed, status = int(parts[0]), parts[2]
    if status != "ok" and status not in flags:
        flags.append(status)
    if status == "ok" and passed < total:
        flags.append("tests_failed")
    return {
        "well_formed": status not in ("import_error", "missing_function"),
        "correct": status == "ok" and passed == total,
        "tests_passed": passed / total if total else 0.0,
        "sandbox_s": float(result.duration_s),
        "cached": False,
        "flags": flags,
        # the sandbox lost its supervisor: not the completion's doing (no reward, out of the advantage)
        "infra_error": SANDBOX_LOST if result.stopped_reason == "sandbox_error" else None,
    }


def pool(workers: int) -> Any:
    """This process's sandbox pool with ``workers`` workers (0: one per CPU), started on first use and kept
    (its workers reuse their containers) until ``close_pools`` or exit."""
    from envs.sandbox.limits import configured_mode
    from envs.sandbox.pool import SandboxPool

    key = (workers, configured_mode())
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = SandboxPool(workers or None, key[1])
        return _POOLS[key]


def close_pools() -> None:
    """Close this process's pools (they also close at exit)."""
    with _POOLS_LOCK:
        while _POOLS:
            _POOLS.popitem()[1].close()


def run_candidates(pairs: Sequence[tuple[dict[str, Any], str]], cfg: Any) -> list[dict[str, Any]]:
    """The outcome of each (task, completion), in order: statically rejected ones without a run, identical
    ones from one run, the rest in the sandbox pool (one run each, ``cfg.workers`` at a time)."""
    out: list[dict[str, Any] | None] = [None] * len(pairs)
    unique: dict[str, list[int]] = {}
    for i, (task, completion) in enumerate(pairs):
        why = defines(task["prompt"] + completion, task["entry"], cfg.max_chars)
        if why is not None:
            out[i] = {
                "well_formed": False,
                "correct": False,
                "tests_passed": 0.0,
                "sandbox_s": 0.0,
                "cached": False,
                "flags": [why],
                "infra_error": None,
            }
            continue
        key = json.dumps([task["prompt"], task["inputs"], task["expected"], completion])
        unique.setdefault(key, []).append(i)
    if unique:
        firsts = [idx[0] for idx in unique.values()]
        nonces = [new_nonce() for _ in firsts]
        jobs = [job(pairs[i][0], pairs[i][1], n, cfg) for i, n in zip(firsts, nonces, strict=True)]
        results = pool(cfg.workers).map(jobs)
        for idx, res, nonce in zip(unique.values(), results, nonces, strict=True):
            first = outcome(res, nonce, len(pairs[idx[0]][0]["expected"]))
            out[idx[0]] = first
            for j in idx[1:]:
                out[j] = {**first, "sandbox_s": 0.0, "cached": True, "flags": list(first["flags"])}
    return [o for o in out if o is not None]
