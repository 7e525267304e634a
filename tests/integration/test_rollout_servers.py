"""Rollout servers (vLLM's OpenAI API in processes of their own), on a tied model: the in-process engine's
outputs whichever server a request lands on, new weights synced in, a killed server restarted and rejoining,
the prefix-cache hit rate reported, nothing left running; and a run on them that replays like any run."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from infra.rollout_servers import OWNER, RolloutServers
from rl_core.artifacts.paths import vllm_ipc_dir
from rl_core.generation.rollout import Request, SamplingSpec
from rl_core.generation.rollout_server import ServerEngine
from rl_core.schema.config import RolloutSection
from tests.conftest import ENGINE_PROMPTS, cli_env, replayed_identical, run_cli, run_script, show_json


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two tied Llama folders with one tokenizer (Qwen2.5/Llama-3.2-style tied embeddings, which vLLM's
    reload alone never re-ties: the servers load the untied view, rl_core/models/engine_view.py)."""
    from rl_core.models.model import load_tokenizer
    from tests.model_folders import write_llama_folder

    root = tmp_path_factory.mktemp("ckpts")
    a = write_llama_folder(root / "A", tie=True, seed=1, max_position=256)
    b = write_llama_folder(root / "B", tie=True, seed=2, max_position=256)
    return load_tokenizer(a), str(a), str(b)


def _in_process(ckpt: str, reqs: list[Request], spec: SamplingSpec, scratch: Path) -> list:
    """The in-process engine's completions, in a process of its own (tests/engine_probe.py, a child of the
    suite's fork server)."""
    arg = {"ckpt": ckpt, "reqs": [[r.prompt_ids, r.seed] for r in reqs], "spec": spec.__dict__}
    argfile = scratch / f"probe-{Path(ckpt).name}.json"
    argfile.write_text(json.dumps(arg))
    out = run_script("tests/engine_probe.py", [str(argfile)], cli_env(scratch / "probe-state"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same(got, want) -> bool:
    """The same completions; logprobs equal up to float rounding (a prompt half served from the prefix cache
    is attended in another split than one prefilled whole, which moves the last bits)."""
    got = [[[c.token_ids, c.logprobs, c.finish_reason] for c in comps] for comps in got]
    pairs = [(x, y) for g, w in zip(got, want, strict=True) for x, y in zip(g, w, strict=True)]
    gap = max(abs(a - b) for x, y in pairs for a, b in zip(x[1], y[1], strict=True))
    assert gap < 1e-4, f"logprobs differ by {gap}"
    return all(x[0] == y[0] and x[2] == y[2] for x, y in pairs)


def _refused_without_the_token(url: str) -> None:
    """Every route but /health refuses a caller without the servers' token, or with another one."""
    import httpx

    assert httpx.get(url + "/health").status_code == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/etc"}}
    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": "Basic x"}):
        for method, path, body in (
            ("POST", "/collective_rpc", rpc),
            ("POST", "/reset_prefix_cache", None),
            ("POST", "/v1/completions", {"model": "policy", "prompt": [5, 6], "max_tokens": 2}),
            ("GET", "/v1/models", None),
            ("GET", "/metrics", None),
        ):
            r = httpx.request(method, url + path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.status_code, r.text[:200])


@pytest.mark.slow
def test_servers_match_the_in_process_engine_take_weights_and_survive_a_kill(checkpoints, tmp_path, s3):
    """... and the weights come from the store: the servers keep a cache of their own (empty at the start),
    the sync names the checkpoint's S3 reference, never a path of this process."""
    from rl_core.artifacts.store import Store

    tok, a, b = checkpoints
    store = Store("s3://rlf-test/ckpts")
    ref_b = store.put_dir(b, f"{store.root}/b")
    own_cache = tmp_path / "server-cache"
    # prompts of 200 tokens: vLLM on CPU caches whole blocks of 128 tokens, so a repeated prompt hits
    reqs = [
        Request((tok(p, add_special_tokens=False)["input_ids"] * 60)[:200], seed=7 + i)
        for i, p in enumerate(ENGINE_PROMPTS)
    ]
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=8)
    servers = RolloutServers(
        a,
        RolloutSection(kv_cache_mb=64),
        max_model_len=256,
        logs=tmp_path / "logs",
        env={"XDG_CACHE_HOME": str(own_cache)},
    )
    urls = servers.start(2)
    try:
        assert all(u.startswith("http://127.0.0.1:") for u in urls)
        _refused_without_the_token(urls[0])
        remote = ServerEngine(
            urls,
            a,
            allowed_token_ids=None,
            restart=servers.restart,
            token=servers.token,
            store_root=store.root,
        )
        first = _in_process(a, reqs, spec, tmp_path)
        assert _same(remote.generate(reqs, spec), first)
        remote.load_weights(tmp_path / "not-a-folder-the-servers-see", ref=ref_b)
        fetched = own_cache / "rlfoundry" / "server-checkpoints" / ref_b.sha256
        got = {p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()} - {".complete"}
        assert got == set(ref_b.files)
        second = _in_process(b, reqs, spec, tmp_path)
        assert [x[0] for g in second for x in g] != [x[0] for g in first for x in g]
        assert _same(remote.generate(reqs, spec), second)
        killed = servers.servers[1].pid
        assert killed in _scratch_of({killed})
        servers.servers[1].kill()  # an outage: the next batch restarts it on B's weights
        assert _same(remote.generate(reqs, spec), second)
        assert remote.restarts == 1 and servers.servers[1].alive()
        stats = remote.stats()
        assert stats["prefix_cache_queries"] > 0 and 0 < stats["prefix_cache_hit_rate"] <= 1
        # each server's temp files (vLLM's distributed file store) in its own folder; the killed one's went
        # at its restart
        pids = {s.pid for s in servers.servers}
        scratch = _scratch_of({*pids, killed})
        assert set(scratch) == pids and all(list(f.glob("vllm_dist_*")) for f in scratch.values()), scratch
    finally:
        servers.stop()
    assert not any(s.alive() for s in servers.servers)
    assert all(not f.exists() for f in scratch.values()) and not _scratch_of(pids)


def _scratch_of(pids: set[int]) -> dict[int, Path]:
    """The temp folders of the rollout servers whose processes are ``pids`` (their OWNER records), by pid."""
    found = {}
    for f in Path(vllm_ipc_dir()).glob("server-*"):
        with contextlib.suppress(OSError, ValueError):
            pid = json.loads((f / OWNER).read_text())["pid"]
            if pid in pids:
                found[pid] = f
    return found


@pytest.mark.slow
def test_a_run_on_rollout_servers_replays_on_the_in_process_engine(tmp_path):
    args = ["--set", "rollout.servers=1", "--set", "tracking.enabled=false"]
    r = run_cli(["run", "configs/smoke.yaml", "--run-id", "srv", *args], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    shown = show_json(tmp_path, "srv")
    first, gen = (shown["iterations"][k]["stages"]["generate"]["metrics"] for k in (0, 1))
    assert gen["prefix_cache_queries"] > 0 and gen["server_restarts"] == 0
    # per iteration, not since the server started (issue 21 item 8): the same number of prompts of about
    # the same length each iteration, so about the same count, where the running total would double
    assert (
        0.5 * first["prefix_cache_queries"]
        < gen["prefix_cache_queries"]
        < 1.5 * first["prefix_cache_queries"]
    )
    assert 0 <= gen["prefix_cache_hit_rate"] <= 1
    replayed_identical(tmp_path, "srv", 2, ["generate"])
