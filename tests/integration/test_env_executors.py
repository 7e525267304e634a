"""execute_envs scales out: the same outcomes, in the same order, inline, from a process pool, and from Ray
tasks on a local Ray cluster.

Ray's servers listen on every interface of the node whatever node IP they are given, so the Ray cluster of
this test runs inside a network namespace of its own (``unshare --net``, loopback only): nothing of it is
reachable from outside the test."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pandas.testing as pdt
import pytest

from rl_core.generation.outcomes import env_outcomes
from rl_core.run.context import RunContext
from rl_core.schema.config import load_config
from tests.conftest import python_in_private_netns


def _rows(ctx: RunContext, multi: bool) -> pd.DataFrame:
    rows = []
    for i, t in enumerate(ctx.train_tasks[:40]):
        for k in range(3):
            r = {
                "prompt_index": i,
                "sample_index": k,
                "task_id": t["task_id"],
                "seed": 100 + i,
                "completion_text": t["answer"] if k == 0 else str(int(t["answer"]) + k) if k == 1 else "x",
            }
            if multi:
                p = t["a"] * t["b"]
                r["actions"] = [
                    f"calc({t['a']}*{t['b']})",
                    f"calc({p}{t['sign']}{t['c']})",
                    f"ans({t['answer']})",
                ][: k + 1]
                r["observations"] = [f"={p}\n", f"={t['answer']}\n"][:k]
                r["turns"] = k + 1
            rows.append(r)
    return pd.DataFrame(rows)


def outcomes(config: str, executor: str) -> pd.DataFrame:
    cfg = load_config(config, ["task.train_size=400", "task.heldout_size=16", f"task.executor={executor}"])
    ctx = RunContext(cfg, "exec-test")
    return env_outcomes(ctx, _rows(ctx, multi=cfg.task.env == "tooluse"))


def ray_outcomes_in_netns(config: str, out: Path) -> None:
    """Run in a private network namespace: a local Ray cluster, then the outcomes to ``out`` (parquet)."""
    import ray

    outcomes(config, "ray").to_parquet(out)
    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"
    assert len(ray.nodes()) == 1 and ray.nodes()[0]["Alive"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/smoke.yaml", "configs/tooluse.yaml"])
def test_inline_process_pool_and_ray_agree(config, state_dir, tmp_path):
    inline = outcomes(config, "inline")
    assert len(inline) == 120 and inline["correct"].sum() >= 40
    if "replay_mismatch" in inline:
        assert not inline["replay_mismatch"].any()
    pdt.assert_frame_equal(inline, outcomes(config, "process"))
    out = tmp_path / "ray.parquet"
    code = (
        "from tests.integration.test_env_executors import ray_outcomes_in_netns as f; "
        f"f({config!r}, {str(out)!r})"
    )
    r = python_in_private_netns(code)
    assert r.returncode == 0, r.stderr[-3000:]
    pdt.assert_frame_equal(inline, pd.read_parquet(out))


@pytest.mark.slow
def test_a_dead_process_pool_worker_reruns_its_chunks_once_then_fails_naming_the_env(tmp_path, monkeypatch):
    """A worker killed mid-chunk (the OOM killer) costs one rerun on a fresh pool, with the same table; a
    worker that dies again is an error naming the environment and the signal, not a bare BrokenProcessPool."""
    cfg = load_config(
        "configs/smoke.yaml",
        ["task.train_size=20", "task.heldout_size=10", "task.executor=process", "task.env_workers=1"],
    )
    ctx = RunContext(cfg, "exec-dying")
    rows = _rows(ctx, multi=False)
    want = env_outcomes(ctx, rows)
    ctx.held.env_pool.shutdown()
    ctx.held.env_pool = None
    cfg.task.env = "tests.dying_env:DyingEnv"
    monkeypatch.setenv("DYING_ENV_MARKER", str(tmp_path / "died-once"))
    try:
        pdt.assert_frame_equal(env_outcomes(ctx, rows), want)
        assert (tmp_path / "died-once").exists()  # a worker did die
        ctx.held.env_pool.shutdown()  # workers read their environment when spawned
        ctx.held.env_pool = None
        monkeypatch.setenv("DYING_ENV_ALWAYS", "1")
        died = r"environment 'tests.dying_env:DyingEnv'.*died twice.*SIGKILL"
        with pytest.raises(RuntimeError, match=died):
            env_outcomes(ctx, rows)
        assert ctx.held.env_pool is None  # the broken pool is not kept for the next stage
    finally:
        if ctx.held.env_pool is not None:
            ctx.held.env_pool.shutdown()
