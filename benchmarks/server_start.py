"""What a vLLM server's start costs on the CPU, with the model in the engine core's process or in a worker
process of its own.

    .venv/bin/python benchmarks/server_start.py --json            # 3 repeats per arm, ABBA order
    .venv/bin/python benchmarks/server_start.py --smoke --json    # the smoke model, 1 repeat per arm

A rollout server (``infra.rollout_servers.RolloutServers``, one server, vLLM's OpenAI API server) on the
default policy's checkpoint, timed from the spawn until ``/health`` answers, then a batch of seeded sampled
completions through the run's client (``rl_core.generation.rollout_server.ServerEngine``), then stopped. Arm
``in_engine`` is the code (``vllm_server_env``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` on the CPU, so vLLM's
CPU platform keeps the ``uni`` executor); arm ``worker_process`` is the code before (vLLM's CPU default: the
API server, its engine core and a worker, three processes each importing torch and vLLM). The arms must
return the same token ids and logprobs.

The last line is one JSON object: per arm the median seconds to start and to generate; ``ratio`` is
worker_process / in_engine start seconds (higher is better: > 1 means the in-engine model starts faster).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, abba, finish, repeats_parser, smoke_state  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "server_start.json"
ARMS = ("in_engine", "worker_process")


def one_start(
    arm: str, folder: str, max_model_len: int, logs: Path, prompts: list[list[int]]
) -> tuple[dict[str, float], list]:
    """Start one server in ``arm``, generate a seeded batch, stop it: the seconds and the completions."""
    from infra.rollout_servers import RolloutServers
    from rl_core.generation.rollout import Request, SamplingSpec
    from rl_core.generation.rollout_server import ServerEngine
    from rl_core.schema.config import RolloutSection

    class WorkerProcess(RolloutServers):
        """The code before: vLLM's CPU default (``VLLM_ENABLE_V1_MULTIPROCESSING`` unset, i.e. 1)."""

        def _env(self, i: int) -> dict[str, str]:
            env = super()._env(i)
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            return env

    kind = RolloutServers if arm == "in_engine" else WorkerProcess
    servers = kind(folder, RolloutSection(kv_cache_mb=64), max_model_len=max_model_len, logs=logs)
    t0 = time.perf_counter()
    urls = servers.start(1)
    t1 = time.perf_counter()
    try:
        engine = ServerEngine(urls, folder, allowed_token_ids=None, token=servers.token)
        reqs = [Request(p, seed=i) for i, p in enumerate(prompts)]
        out = engine.generate(reqs, SamplingSpec(n=4, temperature=1.0, max_tokens=8))
        t2 = time.perf_counter()
    finally:
        servers.stop()
    got = [[[c.token_ids, c.logprobs] for c in cs] for cs in out]
    return {"start_s": t1 - t0, "generate_s": t2 - t1}, got


def main() -> None:
    ap = repeats_parser(__doc__, OUT)
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.overrides = 1, [*SMOKE_SHAPE, *args.overrides]
    smoke_state(args.smoke, "server-start")
    from benchmarks.common import default_policy
    from rl_core.models.model import save_checkpoint

    cfg, _, tok, model = default_policy(args.overrides)
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    outputs: dict[str, Any] = {}
    prompts = [tok(f"{i}+{i + 1}=", add_special_tokens=False)["input_ids"] for i in range(16)]
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, tok, Path(d) / "ckpt")
        for name in abba(ARMS, args.repeats):
            figures, got = one_start(
                name, str(Path(d) / "ckpt"), cfg.model.max_position, Path(d) / "logs", prompts
            )
            runs[name].append(figures)
            if outputs.setdefault(name, got) != got:
                raise SystemExit(f"arm {name}: a repeat returned other completions than its first")
    if outputs["in_engine"] != outputs["worker_process"]:
        raise SystemExit("the arms returned different completions for the same seeded requests")
    med = {name: {k: statistics.median(x[k] for x in got) for k in got[0]} for name, got in runs.items()}
    result = {
        "benchmark": "server_start",
        "repeats": args.repeats,
        "overrides": args.overrides,
        "median": med,
        "runs": runs,
        "same_completions": True,
        "ratio": med["worker_process"]["start_s"] / med["in_engine"]["start_s"],
    }
    finish(result, None if args.smoke else (args.out or OUT), args.json, args.smoke)


if __name__ == "__main__":
    main()
