"""Sandbox throughput: the sandbox pool vs a bare `python3 file.py` subprocess on the same programs.

    .venv/bin/python benchmarks/sandbox.py --json
    .venv/bin/python benchmarks/sandbox.py --smoke --json   # 8 programs, 1 worker, 4 HumanEval solutions

For each worker count, the same programs run (a) bare: `/usr/bin/python3 -E -s file.py` from a thread pool of
that size, files written beforehand, (b) through `SandboxPool` (each worker's long-lived container runs every
job as a fresh interpreter in an emptied workdir, with its rlimits, cgroup limits and timeout), and (c)
through `SandboxPool(reuse=False)` (a new bubblewrap container per job). Both are timed after a warm-up. Then
every HumanEval canonical solution is scored in the sandbox (time and pass rate), and leftovers are counted:
processes of sandbox uids, cgroups, slot files.

The last line is one JSON object; ``ratio`` = sandbox / bare executions per second at workers = CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, smoke_state  # noqa: E402
from envs.sandbox import Limits  # noqa: E402
from envs.sandbox.core import PYTHON, slot_processes  # noqa: E402
from envs.sandbox.pool import SandboxPool  # noqa: E402


def programs(n: int) -> list[str]:
    """Small, varied, deterministic programs (loops, strings, sorting, recursion), like test-running code."""
    kinds = [
        "print(sum(i * i for i in range({k} * 100)))",
        "s = ''.join(chr(97 + (i * 7) % 26) for i in range({k} * 50))\nprint(s.count('a'), s[:10])",
        (
            "import random\nr = random.Random({k})\nxs = [r.random() for _ in range(2000)]\n"
            "print(sorted(xs)[{k} % 100])"
        ),
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nassert fib(15) == 610\nprint({k})",
        "import json\nprint(json.dumps({{'k': {k}, 'v': list(range(50))}})[:20])",
    ]
    return [kinds[i % len(kinds)].format(k=i + 1) for i in range(n)]


def bare(progs: list[str], workers: int, tmp: Path) -> float:
    files = []
    for i, p in enumerate(progs):
        f = tmp / f"p{i}.py"
        f.write_text(p)
        files.append(f)

    def one(f: Path) -> int:
        return subprocess.run([PYTHON, "-E", "-s", str(f)], capture_output=True, timeout=30).returncode

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, files[:8]))  # warm-up
        t0 = time.perf_counter()
        codes = list(ex.map(one, files))
        dt = time.perf_counter() - t0
    assert all(c == 0 for c in codes), "a benchmark program failed bare"
    return len(files) / dt


def sandboxed(progs: list[str], workers: int, reuse: bool = True) -> float:
    jobs = [{"files": {"main.py": p}} for p in progs]
    with SandboxPool(workers, reuse=reuse) as pool:
        pool.map(jobs[:8], Limits(timeout_s=30))  # warm-up (spawns the workers)
        t0 = time.perf_counter()
        res = pool.map(jobs, Limits(timeout_s=30))
        dt = time.perf_counter() - t0
    bad = [r for r in res if r.exit_code != 0]
    assert not bad, f"{len(bad)} sandboxed programs failed: {bad[0]}"
    return len(jobs) / dt


def leftovers() -> dict[str, int]:
    cgroups = len(list(Path("/sys/fs/cgroup").glob("**/rlfoundry-sandbox/run-*")))
    return {"processes": len(slot_processes()), "cgroups": cgroups}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json", action="store_true")
    add_smoke_flag(ap)
    args = ap.parse_args()
    solutions = None  # all of them
    if args.smoke:
        args.programs, args.workers, solutions = 8, [1], 4
    smoke_state(args.smoke, "sandbox")
    progs = programs(args.programs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workers:
            b = bare(progs, w, Path(tmp))
            s = sandboxed(progs, w)
            f = sandboxed(progs, w, reuse=False)
            rows.append(
                {
                    "workers": w,
                    "bare_exec_s": round(b, 1),
                    "sandbox_exec_s": round(s, 1),
                    "ratio": round(s / b, 3),
                    "fresh_container_exec_s": round(f, 1),
                    "fresh_container_ratio": round(f / b, 3),
                }
            )
            print(
                f"workers {w}: bare {b:.1f}/s  sandbox {s:.1f}/s  ratio {s / b:.2f}  "
                f"(a container per run: {f:.1f}/s, {f / b:.2f})",
                file=sys.stderr,
            )
    from envs.humaneval import canonical_completions, score

    t0 = time.perf_counter()
    he = score(canonical_completions()[:solutions])
    he_s = time.perf_counter() - t0
    print(f"HumanEval canonical solutions: pass rate {he['pass_rate']:.3f} in {he_s:.1f} s", file=sys.stderr)
    left = leftovers()
    headline = next((r for r in rows if r["workers"] == os.cpu_count()), rows[-1])
    out = {
        "benchmark": "sandbox",
        "programs": len(progs),
        "rows": rows,
        "humaneval_canonical": {
            "problems": len(he["results"]),
            "pass_rate": he["pass_rate"],
            "seconds": round(he_s, 2),
        },
        "leftovers": left,
        "ratio": headline["ratio"],
        "ratio_definition": (
            f"sandbox pool / bare python3 executions per second, {headline['workers']} workers"
        ),
    }
    finish(out, None, args.json, args.smoke)
    if not args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
