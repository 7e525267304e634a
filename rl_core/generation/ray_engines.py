"""The rollout engines as Ray actors on a cluster (``cluster.ray_address`` with ``rollout.servers: N``), and
the one schedule every set of N engines follows.

    engines = RayEngines(ctx, local_folder)        # N actors, one per bundle of a SPREAD placement group
    outs = engines.generate(requests, spec)        # request i to engine i mod N, answers in request order
    engines.load_weights(folder, weights)          # the trainer's state dict to every engine, over Ray

Each actor holds the run's own in-process engine (``rl_core.generation.rollout.start_engine``: vLLM, or the HF
engine where ``auto`` picks it) on its node, started from the policy folder's files sent through Ray's object
store into a scratch folder of the actor's own: no local path crosses nodes. It samples with the calling
stage's torch thread count (the CPU kernels' sums depend on it), as the in-process engine would. The weights
after every update go the same way, put once and read by every engine (``weight_sync_s``: the seconds of the
last sync to all of them). The actors live as long as the run's context, across iterations, like the
in-process engine.

The schedule is the config's, not the cluster's: requests are dealt round-robin (``shards``) and the answers
put back in request order (``merge``), so which engine finished first never matters, and one machine with
the HF engine and ``rollout.servers: N`` deals the same shards to its one in-process engine in turn
(``Shards``): a run on a cluster samples what the same config samples on one machine, bit for bit. An
engine whose actor dies (its node lost) fails the stage in one line naming the engine and its node.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from rl_core.generation.rollout import Completion, Request, SamplingSpec, start_engine
from rl_core.run.cluster import PlacementTimeout, Probe, cause, outcomes, place, release


class EngineLost(RuntimeError):
    """A rollout engine's actor died or failed; the message names the engine and its Ray node."""


def shards(requests: list[Request], n: int) -> list[list[Request]]:
    """Request i to engine i mod ``n``.

    >>> [[r.seed for r in s] for s in shards([Request([1], seed=i) for i in range(5)], 2)]
    [[0, 2, 4], [1, 3]]
    """
    return [requests[i::n] for i in range(n)]


def merge(parts: list[list[Any]]) -> list[Any]:
    """The answers of ``shards`` back in request order.

    >>> merge([[0, 2, 4], [1, 3]])
    [0, 1, 2, 3, 4]
    """
    n = len(parts)
    total = sum(len(p) for p in parts)
    return [parts[i % n][i // n] for i in range(total)]


class Shards:
    """One in-process engine serving the shards of ``n`` engines in turn: the one-machine form of a cluster's
    N engines (the HF engine's batch is its shard, so its samples are the cluster's)."""

    def __init__(self, engine: Any, n: int):
        self.engine, self.n = engine, n
        self.loaded = None

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        return merge([self.engine.generate(s, spec) if s else [] for s in shards(requests, self.n)])

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: Any = None
    ) -> None:
        self.engine.load_weights(ckpt_dir, weights, ref=ref)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def close(self) -> None:
        self.engine.close()


def folder_files(folder: str | Path) -> dict[str, bytes]:
    """Every file of a checkpoint folder by its relative path (what an actor writes into its own folder)."""
    root = Path(folder)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".complete"
    }


class _Engine(Probe):
    """One rollout engine in a Ray actor's process."""

    def start(
        self, files: dict[str, bytes], kind: str, rollout_cfg: Any, max_model_len: int, placement: Any
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rlfoundry-engine-"))  # this node's own scratch
        for rel, data in files.items():
            (self.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / rel).write_bytes(data)
        self.engine = start_engine(
            kind, self.folder, rollout_cfg, max_model_len=max_model_len, placement=placement
        )

    def generate(self, requests: list[Request], spec: SamplingSpec, threads: int) -> list[list[Completion]]:
        from rl_core.models.machine import torch_threads

        with torch_threads(threads):
            return self.engine.generate(requests, spec)

    def load(self, weights: dict[str, Any]) -> None:
        self.engine.load_weights(self.folder, weights)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()


class RayEngines:
    """``rollout.servers`` engines as Ray actors on the run's cluster, an in-process engine's interface."""

    def __init__(self, ctx: Any, folder: str | Path):
        import ray

        cfg = ctx.cfg
        self.n, self.address = cfg.rollout.servers, cfg.cluster.ray_address
        self.kind = ctx.placement.rollout_engine
        gpus = len(ctx.placement.server_gpus[0]) if ctx.placement.server_gpus else 0
        try:
            self.pg, self.actors, where = place(
                ctx,
                _Engine,
                f"rollout engines (rollout.servers={self.n})",
                count=self.n,
                gpus=gpus,
                unit="engines",
            )
        except PlacementTimeout as e:
            raise EngineLost(str(e)) from None
        self.where = [{k: w[k] for k in ("node", "address", "device")} | {"engine": self.kind} for w in where]
        placement = ctx.placement.for_engine_actor()
        files = ray.put(folder_files(folder))
        start = [
            a.start.remote(files, self.kind, cfg.rollout, ctx.max_model_len(), placement) for a in self.actors
        ]
        self._all(start, "start")
        self.loaded = None
        self.sync_s = 0.0

    def _all(self, refs: list[Any], what: str) -> list[Any]:
        """Every engine's answer, in engine order; a failure names the engine ``cluster.cause`` picks."""
        import ray

        try:
            return ray.get(refs)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            ray.wait(refs, num_returns=len(refs), timeout=10)
        found = cause(outcomes(refs))
        if found is not None:
            i, how = found
            node = self.where[i].get("node", "?")[:12]
            raise EngineLost(f"rollout engine {i} of {self.n} on Ray node {node} ({what}): {how}") from None
        raise EngineLost(f"rollout engines ({what}): a Ray call failed and no engine names the cause")

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        import torch

        # The calling stage's torch threads, not the actor's own count (Ray gives it one per CPU): the CPU
        # kernels' sums depend on the thread count, and the samples' logprobs must be the in-process engine's.
        threads = torch.get_num_threads()
        parts = shards(requests, self.n)
        calls = [a.generate.remote(p, spec, threads) for a, p in zip(self.actors, parts, strict=True)]
        return merge(self._all(calls, "generate"))

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: Any = None
    ) -> None:
        """Every engine loads the trainer's weights (``weights``; None: the folder's), put once in Ray's
        object store and read from there by each engine's node."""
        import ray

        if weights is None:
            from rl_core.models.model import load_model

            weights = load_model(ckpt_dir).state_dict()
        began = time.perf_counter()
        shared = ray.put({k: v.detach().cpu() for k, v in weights.items()})
        self._all([a.load.remote(shared) for a in self.actors], "weight sync")
        self.sync_s = time.perf_counter() - began

    def stats(self) -> dict[str, Any]:
        """The engines' prefix-cache figures summed, the last weight sync's seconds, each engine's node."""
        each = self._all([a.stats.remote() for a in self.actors], "stats")
        queries = sum(s.get("prefix_cache_queries", 0.0) for s in each)
        hits = sum(s.get("prefix_cache_hit_rate", 0.0) * s.get("prefix_cache_queries", 0.0) for s in each)
        out: dict[str, Any] = {"weight_sync_s": round(self.sync_s, 4)}
        if queries:
            out.update(prefix_cache_queries=queries, prefix_cache_hit_rate=hits / queries)
        out["placement"] = {
            "ray_address": self.address,
            "rollout_engines": [{"engine": i, **w} for i, w in enumerate(self.where)],
        }
        return out

    def close(self) -> None:
        release(self.pg, self.actors)
