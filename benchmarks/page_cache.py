"""What writing a train stage's checkpoint and optimizer state costs, with the store handing the pages of its
large files back to the kernel once they are on disk (``rl_core.artifacts.page_cache``) or keeping them all
cached (the code before).

    .venv/bin/python benchmarks/page_cache.py --json            # 60 steps per arm, ABBA x 2, 20 s apart
    .venv/bin/python benchmarks/page_cache.py --smoke --json    # the smoke shape, 3 steps, no pause

Each step writes the files the train stage writes for the default policy (``configs/default.yaml``: its
weights as ``model.safetensors``, its AdamW state, both as big as the run's) through ``Store.put_bytes`` into
a new iteration folder of a local store on the machine's state folder, then keeps one core busy for
``--gap-ms`` (the rest of a step, in which the kernel writes the files back). Arms: ``handed_back`` (the
store as it is) and ``kept`` (a store whose ``WrittenPages`` does nothing). The arms run ABBA, each from a
store of its own that is deleted after it, ``--pause`` seconds apart: a virtual machine takes back the pages
freed by the arm before (free page reporting), so each arm starts from the same state.

The last line is one JSON object: per arm each step's write milliseconds, their median, and how much the page
cache grew; ``ratio`` is kept / handed_back median write time (higher is better: > 1 means the writes cost
less when the pages are handed back).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE_SHAPE, abba, finish, repeats_parser, result_file, smoke_state  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "page_cache.json"
ARMS = ("handed_back", "kept")


def step_files(overrides: list[str]) -> dict[str, bytes]:
    """The train stage's large files for the default policy: its weights and its AdamW state (two float32
    moments per parameter), as many bytes as the run writes (random: what is measured is the write)."""
    from benchmarks.common import default_policy
    from rl_core.models.model import weight_files

    _, _, _, model = default_policy(overrides)
    weights = weight_files(model.state_dict(), tied=bool(model.config.tie_word_embeddings))
    params = sum(p.numel() for p in model.parameters())
    sizes = {name: len(data) for name, data in weights.items()} | {"optimizer.safetensors": params * 8}
    return {name: os.urandom(size) for name, size in sizes.items()}


def cached_mb() -> float:
    """The machine's page cache (``Cached`` of /proc/meminfo), in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def busy(ms: float) -> None:
    """One core busy for ``ms`` milliseconds (Python bytecode, as the stages between two writes)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        sum(range(1000))


def one_arm(arm: str, files: dict[str, bytes], steps: int, gap_ms: float, root: Path) -> dict[str, Any]:
    """``steps`` steps of writes in a new store under ``root``: each step's write milliseconds."""
    from rl_core.artifacts.page_cache import WrittenPages
    from rl_core.artifacts.store import Store

    class Kept(WrittenPages):
        """The code before: every written file's pages stay in the page cache."""

        def wrote(self, path: str, size: int) -> None:
            return None

    folder = Path(tempfile.mkdtemp(dir=root, prefix=f"{arm}-"))
    store = Store(str(folder))
    if arm == "kept":
        store.pages = Kept()
    before, ms = cached_mb(), []
    try:
        for k in range(1, steps + 1):
            out = store.stage_uri("run", k, "train")
            t0 = time.perf_counter()
            for name, data in files.items():
                store.put_bytes(f"{out}/{name}", data)
            ms.append(round((time.perf_counter() - t0) * 1e3, 2))
            busy(gap_ms)
        grew = round(cached_mb() - before, 1)
    finally:
        shutil.rmtree(folder)
    return {"write_ms": ms, "median_write_ms": statistics.median(ms), "page_cache_growth_mb": grew}


def main() -> None:
    ap = repeats_parser(__doc__, OUT)  # --repeats: rounds of the two arms, ABBA
    ap.set_defaults(repeats=2)
    ap.add_argument("--steps", type=int, default=60, help="steps per arm")
    ap.add_argument("--gap-ms", type=float, default=150.0, help="busy milliseconds between two steps' writes")
    ap.add_argument("--pause", type=float, default=20.0, help="seconds between two arms")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.repeats, args.pause, args.overrides = 3, 1, 0.0, [*SMOKE_SHAPE, *args.overrides]
    smoke_state(args.smoke, "page-cache")
    from rl_core.artifacts.paths import state_dir

    root = state_dir() / "page_cache"
    root.mkdir(parents=True, exist_ok=True)
    files = step_files(args.overrides)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    for i, arm in enumerate(abba(ARMS, args.repeats)):
        if i:
            time.sleep(args.pause)
        runs[arm].append(one_arm(arm, files, args.steps, args.gap_ms, root))
        print(f"{arm}: {runs[arm][-1]['median_write_ms']} ms a step", file=sys.stderr, flush=True)
    med = {a: statistics.median(r["median_write_ms"] for r in runs[a]) for a in ARMS}
    result = {
        "benchmark": "page_cache",
        "bytes_per_step": {name: len(data) for name, data in files.items()},
        "steps": args.steps,
        "gap_ms": args.gap_ms,
        "pause_s": args.pause,
        "arms": runs,
        "median_write_ms": med,
        "ratio": round(med["kept"] / med["handed_back"], 3),
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
