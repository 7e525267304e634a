"""MiniWoB++ episodes per second through envs/miniwob.py's browser pool, one browser against one per page.

    .venv/bin/python benchmarks/miniwob_env.py --json            # 30 episodes per arm, arms alternating
    .venv/bin/python benchmarks/miniwob_env.py --smoke --json    # 3 episodes per arm

An episode is what a rollout's environment does with it: ``reset`` (the instruction) and ``image`` (the
first screenshot: one page start for both), then the oracle's actions one ``step`` each (each step restarts
the page on its seed, replays the episode's actions and takes the next screenshot). The episodes mix the
three default tasks (``click-button``, ``click-link`` and the three-action ``enter-text``) as drawn. Arm
``one`` has one browser for the process, which reloads whenever the page changes; arm ``per_page`` has three,
each kept on its page (``browsers: 3``, the default). The browsers are started before timing, the oracle's
actions read before timing (the DOM is not what is measured), and the arms alternate in rounds, so both see
the same machine load. ``ratio`` is per_page / one episodes per second (higher is better).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, installed, result_file  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "miniwob_env.json"


def _episodes(env: object, tasks: list[dict], actions: list[list[str]]) -> tuple[float, int]:
    """Seconds for every task's episode, and how many the oracle's actions solved."""
    began, solved = time.perf_counter(), 0
    for task, acts in zip(tasks, actions, strict=True):
        env.reset(task, 0)  # type: ignore[attr-defined]
        env.image(task)  # type: ignore[attr-defined]
        res = None
        for a in acts:
            res = env.step(a)  # type: ignore[attr-defined]
        solved += bool(res is not None and res.done and res.outcome["correct"])
    return time.perf_counter() - began, solved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--episodes", type=int, default=30, help="episodes per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.episodes, args.rounds = 3, 1

    import envs.miniwob as mw
    from rl_core.schema.config import load_config

    cfg = load_config(None, [f"task.train_size={max(args.episodes, 10)}", "task.heldout_size=10"])
    arms = {"one": mw.MiniWoBEnv(mw.MiniWoBOptions(browsers=1)), "per_page": mw.MiniWoBEnv()}
    tasks = arms["per_page"].tasks("train", cfg.task, 0)[: args.episodes]  # a mix, as drawn
    actions = [mw.oracle_actions(arms["per_page"], t) for t in tasks]
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    solved: dict[str, int] = dict.fromkeys(arms, 0)
    for _ in range(args.rounds):
        for name, env in arms.items():
            mw.POOL.close()  # each arm starts its own browsers, before timing
            mw._first.cache_clear()  # and starts every episode's page itself (reset and image: one start)
            for t in tasks[: len(mw.DEFAULT_TASKS)]:
                env.image(t)
            s, ok = _episodes(env, tasks, actions)
            seconds[name].append(s)
            solved[name] += ok
    mw.POOL.close()
    rate = {name: args.episodes / statistics.median(s) for name, s in seconds.items()}
    result = {
        "benchmark": "miniwob_env",
        "episodes": args.episodes,
        "rounds": args.rounds,
        "tasks": list(mw.DEFAULT_TASKS),
        "seconds": seconds,
        "episodes_per_s": rate,
        "solved": solved,
        "versions": {
            "miniwob": installed("miniwob"),
            "selenium": installed("selenium"),
            "chromium": subprocess.run(
                [mw.browser_paths()[0], "--version"], capture_output=True, text=True
            ).stdout.strip(),
        },
        "ratio": rate["per_page"] / rate["one"],
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
