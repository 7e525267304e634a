"""The train stage's checkpoint written behind the flow or in the stage, measured inside one run.

    .venv/bin/python benchmarks/write_behind.py --json                  # 64 x 1 (vs_trl's shape), 32 steps
    .venv/bin/python benchmarks/write_behind.py --workload default --iterations 16 --json
    .venv/bin/python benchmarks/write_behind.py --smoke --json          # smoke shape, 4 iterations

One flow run of one of ``benchmarks/vs_trl.py``'s workloads (its config and overrides, evaluation only at
the start and the end, off the clock) whose store switches ``store.write_behind`` after every iteration:
odd iterations write the checkpoint and optimizer state behind the flow (the stage hands its writes and its
manifest's commit to the store's write-behind thread; the flow waits for it where it next reads the stage
or writes its lineage records), even ones write them in the train stage, as before. The same bytes are
written either way; the machine's drift moves both alike. The first pair is not timed (warm-up).

Reported per mode: the steps' seconds and their median, in how many adjacent pairs writing behind was the
faster, the train stage's seconds from its manifests (behind: without the writes), and the milliseconds the
flow waited for the writes (``wait_ms``: at the iteration's end, or where a stage read them first). The last
line is one JSON object; ``ratio`` is the in-stage median over the write-behind median (above 1: writing
behind is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, new_run, result_file, smoke_state, workload_config_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def behind_at(k: int) -> bool:
    """Whether iteration ``k`` writes behind: the odd ones.

    >>> [behind_at(k) for k in range(1, 5)]
    [True, False, True, False]
    """
    return k % 2 == 1


@contextlib.contextmanager
def s3_store(on: bool) -> Iterator[list[str]]:
    """With ``on``: a real S3 server on 127.0.0.1 (SeaweedFS, ``infra/localstack/s3_server.py``) and a bucket
    of its own for the run's store; the config override that points the store at it."""
    if not on:
        yield []
        return
    import secrets

    import s3fs

    from infra.localstack.s3_server import S3Server

    key, secret = "bench", secrets.token_hex(16)
    srv = S3Server.start(Path(tempfile.mkdtemp(prefix="rlf-bench-weed-")), access_key=key, secret_key=secret)
    env = {"AWS_ENDPOINT_URL": srv.endpoint, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    os.environ.update(env | {"AWS_DEFAULT_REGION": "us-east-1"})
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir("rlf-bench")
        yield ["store.uri=s3://rlf-bench/write_behind"]
    finally:
        srv.stop()


def run(workload: str, iterations: int, sets: list[str], smoke: bool) -> dict[str, Any]:
    from flows.experiment import experiment_flow
    from rl_core.artifacts.report import subscribe
    from rl_core.artifacts.stage import committed
    from rl_core.artifacts.write_behind import WriteBehind
    from tasks import common

    cfg = workload_config_for("write_behind", workload, iterations, sets, smoke)
    run_id, ctx = new_run(cfg, "write_behind")
    stamps: dict[int, tuple[float, float]] = {}
    waited: dict[int, float] = {}
    settle = WriteBehind.settle

    def waiting(self: Any, uri: str | None = None) -> None:
        t0, busy = time.perf_counter(), bool(self.pending())
        try:
            return settle(self, uri)
        finally:
            if busy:
                k = max(stamps, default=0) + 1  # the iteration under way
                waited[k] = waited.get(k, 0.0) + time.perf_counter() - t0

    def stamp(ev: dict[str, Any]) -> None:
        if ev["kind"] == "iteration":
            stamps[ev["iteration"]] = (time.perf_counter(), ev.get("timings", {}).get("evaluate", 0.0))
            for c in common._CONTEXTS.values():  # the run in this process: the next iteration's mode
                c.store.write_behind = behind_at(ev["iteration"] + 1)

    for c in common._CONTEXTS.values():
        c.store.write_behind = behind_at(1)
    WriteBehind.settle = waiting  # type: ignore[method-assign]
    unsubscribe = subscribe(stamp)
    try:
        experiment_flow(cfg, run_id)
    finally:
        unsubscribe()
        WriteBehind.settle = settle  # type: ignore[method-assign]
    step = {k: stamps[k][0] - stamps[k - 1][0] - stamps[k][1] for k in range(1, iterations + 1)}
    train = {k: m.timings.seconds for k in step if (m := committed(ctx.store, run_id, k, "train"))}
    by: dict[str, dict[str, list[float]]] = {"behind": {}, "in_stage": {}}
    for k in range(3, iterations + 1):  # the first pair warms up
        seen = by["behind" if behind_at(k) else "in_stage"]
        seen.setdefault("step_s", []).append(round(step[k], 4))
        seen.setdefault("train_s", []).append(train[k])
        seen.setdefault("wait_ms", []).append(round(waited.get(k, 0.0) * 1000, 2))
    pairs = list(zip(by["behind"]["step_s"], by["in_stage"]["step_s"], strict=True))
    out: dict[str, Any] = {"run_id": run_id, "workload": workload, "iterations": iterations, "sets": sets}
    out["engine"] = ctx.placement.rollout_engine
    for mode, seen in by.items():
        out[mode] = seen | {f"median_{n}": round(statistics.median(v), 4) for n, v in seen.items()}
    out["behind_faster_pairs"] = f"{sum(b < s for b, s in pairs)} of {len(pairs)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="64x1", help="a workload of benchmarks/vs_trl.py (default 64x1)")
    ap.add_argument("--iterations", type=int, default=32, help="RL steps (even)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override")
    ap.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    ap.add_argument("--out", type=Path, help="result file (default benchmarks/results/write_behind.json)")
    ap.add_argument("--s3", action="store_true", help="the store on a real S3 server on this machine")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.iterations = 4
    if args.iterations < 4 or args.iterations % 2:
        raise SystemExit(f"--iterations {args.iterations}: need an even number, at least 4")
    smoke_state(args.smoke, "write-behind")
    os.environ.setdefault("RLFOUNDRY_STATE_DIR", str(ROOT / ".state" / "write_behind"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    with s3_store(args.s3) as store_sets:
        found = run(args.workload, args.iterations, [*store_sets, *args.sets], args.smoke)
    result = {"benchmark": "write_behind", "store": "s3" if args.s3 else "local", **found}
    behind, in_stage = result["behind"]["median_step_s"], result["in_stage"]["median_step_s"]
    result["ratio"] = round(in_stage / behind, 4)
    print(
        f"step s (median): behind {behind}, in the stage {in_stage}; behind faster in "
        f"{result['behind_faster_pairs']} pairs; ratio {result['ratio']}; wait ms (median) "
        f"{result['behind']['median_wait_ms']}",
        flush=True,
    )
    where = ["s3"] if args.s3 else []
    name = "_".join(["write_behind", *where, *([args.workload] if args.workload != "64x1" else [])]) + ".json"
    out = result_file(args.out, ROOT / "benchmarks" / "results" / name, args.smoke)
    finish(result, out, args.json, args.smoke)


if __name__ == "__main__":
    main()
