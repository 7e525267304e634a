"""The Prefect server beside a run: the stack's configuration (UI on, every service) against a run's private
one (no UI, none of the services that only feed it: ``infra.localstack.prefect_server.UI_ONLY_SERVICES``).

    .venv/bin/python benchmarks/prefect_server.py --json                 # 64 x 1 (vs_trl's shape), 24 steps
    .venv/bin/python benchmarks/prefect_server.py --workload default --iterations 12 --json
    .venv/bin/python benchmarks/prefect_server.py --smoke --json         # smoke shape, 2 steps, one round

One server of each configuration is started on 127.0.0.1, each with a home of its own (``start`` in
``infra/localstack/prefect_server.py``, as ``rlfoundry up`` and ``ensure_api`` start them). Each arm is a
process running one of ``benchmarks/vs_trl.py``'s workloads (its config, evaluation only at the start and the
end, off the clock) for ``--iterations`` steps against one of them, in ABBA order over ``--rounds`` rounds
(the base model built by the first arm, before either is timed). The two runs do the same work; only the
server differs, and it runs on the same 2 cores as the stages.

Reported per configuration: each arm's median seconds per step (steps 2..N, as ``vs_trl.py`` counts them),
the server's CPU seconds per step over the same steps (read by the arm, at its iteration events, from the
server's process), and their medians over the arms. The last line is one JSON object; ``ratio`` is the full
server's median step over the private one's (above 1: the run beside the private server is faster).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import abba, arms_args, arms_result_file, arms_setup, finish, run_arms  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("full", "private")
PID_ENV = "RLFOUNDRY_BENCH_SERVER_PID"  # the arm's server process, whose CPU it reads


def arm(workload: str, iterations: int, smoke: bool, run_id: str) -> dict[str, Any]:
    """In the arm's process: the workload's flow against PREFECT_API_URL; the steps' seconds and the
    server's CPU seconds (its pid: PID_ENV) at each iteration event."""
    import psutil

    from benchmarks import vs_trl
    from rl_core.artifacts.report import subscribe

    tether = psutil.Process(int(os.environ[PID_ENV]))
    server = [tether, *tether.children(recursive=True)]  # (the tether, and the server it started)
    marks: dict[int, float] = {}

    def cpu(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            marks[ev["iteration"]] = sum(t.user + t.system for t in (p.cpu_times() for p in server))

    vs_trl.profile_stages = lambda *a, **k: {}  # (only the steps)
    stop = subscribe(cpu)
    try:
        args = argparse.Namespace(
            workload=workload, iterations=iterations, staleness=0, smoke=smoke, engine="auto", run_id=run_id
        )
        out = vs_trl.rlfoundry_arm(args)
    finally:
        stop()
    clock = [0.0, *out["clock_s"]]
    steps = [b - a for a, b in zip(clock, clock[1:], strict=False)][1:] or [clock[-1]]
    first = 1 if iterations > 1 else 0
    server_s = (marks[iterations] - marks[first]) / max(iterations - first, 1)
    return {
        "step_s": round(statistics.median(steps), 4),
        "server_cpu_s": round(server_s, 4),
        "setup_s": out["setup_s"],
    }


def run(workload: str, iterations: int, rounds: int, smoke: bool) -> dict[str, Any]:
    from infra.localstack.prefect_server import health_url, start
    from rl_core.artifacts.paths import free_port, state_dir

    home = state_dir() / "prefect_server_bench"
    servers, ports = {}, {}
    for name in SERVERS:
        ports[name] = port = free_port()
        where = home / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        servers[name] = start(port, where, where / "server.log", ui=name == "full", tie_to_parent=True)
    for name, srv in servers.items():
        srv.wait_http(health_url(ports[name]), timeout_s=120)

    def cmd(name: str, i: int) -> list[str]:
        run_id = f"prefect-server-{name}-{time.strftime('%Y%m%d-%H%M%S')}-{i}"
        out = [__file__, "--arm", "--workload", workload, "--iterations", str(iterations)]
        return [*out, "--run-id", run_id, *(["--smoke"] if smoke else [])]

    def env(name: str) -> dict[str, str]:  # (each arm against its own server)
        pid = str(servers[name].pid)
        return {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{ports[name]}/api", PID_ENV: pid}

    try:
        by = run_arms("prefect_server", abba(SERVERS, rounds), cmd, env)
    finally:
        for srv in servers.values():
            srv.stop()
    return {"workload": workload, "iterations": iterations, "rounds": rounds, **by}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arms_args(ap, iterations=24, rounds=2, out="prefect_server.json")
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = arms_setup(ap, "prefect_server")
    if args.arm:
        print(json.dumps(arm(args.workload, args.iterations, args.smoke, args.run_id)))
        return
    result = {"benchmark": "prefect_server", **run(args.workload, args.iterations, args.rounds, args.smoke)}
    full, private = result["full"]["median_step_s"], result["private"]["median_step_s"]
    result["ratio"] = round(full / private, 4)
    print(
        f"step s (median): full server {full}, private {private}; server CPU s per step "
        f"{result['full']['median_server_cpu_s']} and {result['private']['median_server_cpu_s']}; "
        f"ratio {result['ratio']}",
        flush=True,
    )
    out = arms_result_file(args, "prefect_server")
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
