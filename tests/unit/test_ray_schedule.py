"""The cluster path's logic that runs without a cluster (issue 43): the one schedule of N rollout engines
(request i to engine i mod N, answers back in request order, on one machine as on a cluster), the engine
``auto`` picks when the engines are Ray actors, and the rendezvous probe a train stage's ranks run before
torch.distributed (rank 0 listens on its node's address; a peer that cannot reach it is named)."""

from __future__ import annotations

import pytest

from rl_core.artifacts.paths import free_port
from rl_core.generation.ray_engines import Shards, merge, shards
from rl_core.generation.rollout import Completion, Request, SamplingSpec
from rl_core.models.engine_choice import choose_engine
from rl_core.models.memory_plan import Shape
from rl_core.run.cluster import Probe, unreachable
from rl_core.schema.config import config_from_dict


class Recording:
    """An engine that answers each request with its seed and records the batches it was given."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        self.batches.append([r.seed for r in requests])
        return [[Completion([r.seed], [0.0], str(r.seed), "stop")] * spec.n for r in requests]


@pytest.mark.parametrize("n, engines", [(7, 2), (7, 3), (2, 4), (1, 1), (12, 4)])
def test_n_engines_get_every_ith_request_and_answer_in_request_order(n, engines):
    requests = [Request([1, 2], seed=100 + i) for i in range(n)]
    parts = shards(requests, engines)
    assert sorted(r.seed for p in parts for r in p) == [r.seed for r in requests]
    assert all(r.seed % engines == (100 + e) % engines for e, p in enumerate(parts) for r in p)
    assert [r.seed for r in merge(parts)] == [r.seed for r in requests]

    one = Recording()
    outs = Shards(one, engines).generate(requests, SamplingSpec(n=2, max_tokens=4))
    assert [o[0].text for o in outs] == [str(r.seed) for r in requests] and all(len(o) == 2 for o in outs)
    # the one engine got each engine's shard as a batch of its own, in engine order, no empty batch
    assert one.batches == [[r.seed for r in p] for p in parts if p]


def test_auto_picks_by_the_policy_when_the_engines_are_ray_actors():
    """On one machine rollout.servers are vLLM servers; as Ray actors they hold the run's own engine, so auto
    picks as for the in-process engine (HF for a small policy on the CPU)."""
    small = Shape(800_000, 4, 128, 512, 64, 128)
    one_machine = config_from_dict({"rollout": {"engine": "auto", "servers": 2}})
    on_cluster = config_from_dict(
        {"rollout": {"engine": "auto", "servers": 2}, "cluster": {"ray_address": "10.0.0.1:6379"}}
    )
    assert choose_engine(one_machine, False, small, False)[0] == "vllm"
    assert choose_engine(on_cluster, False, small, False)[0] == "hf"


def test_a_rank_reaches_rank_0s_rendezvous_only_where_rank_0_listens():
    port = free_port()
    zero, peer = Probe(), Probe()
    assert peer.reach("127.0.0.1", port, 2.0).startswith("ConnectionRefusedError")  # nobody there yet
    zero.listen("127.0.0.1", port)
    try:
        assert peer.reach("127.0.0.1", port, 2.0) == ""
        assert peer.reach("127.0.0.1", port, 2.0) == ""  # it keeps accepting: every peer probes
        # bound to its node's address only: another address of the machine does not reach it
        assert peer.reach("127.0.0.2", port, 2.0).startswith("ConnectionRefusedError")
    finally:
        zero.unlisten()
    assert peer.reach("127.0.0.1", port, 2.0).startswith("ConnectionRefusedError")  # the port is free again
    zero.listen("127.0.0.1", port)  # and can be bound at once (torch.distributed binds it next)
    zero.unlisten()


def test_the_line_names_the_first_rank_that_cannot_rendezvous_and_counts_the_others():
    where = [{"node": f"{c}" * 30, "address": f"10.0.0.{i}"} for i, c in enumerate("abcd")]
    line = unreachable(
        ["", "", "TimeoutError: timed out", "ConnectionRefusedError: x"], where, ("10.0.0.0", 29500)
    )
    assert line.startswith("rank 2 on Ray node cccccccccccc (10.0.0.2) cannot reach rank 0's rendezvous ")
    assert "10.0.0.0:29500 (TimeoutError: timed out) (and 1 more rank(s))" in line
    assert "\n" not in line
    assert unreachable(["", "", "", ""], where, ("10.0.0.0", 29500)) == ""


def test_the_failure_named_is_the_lowest_dead_actor_before_any_that_merely_failed():
    """A lost node kills its actor; its peers then fail in their next collective or call. Whatever order Ray
    reports them in, the line names the lowest actor that died, else the lowest that failed (ranks and
    rollout engines alike)."""
    from rl_core.run.cluster import DIED, cause

    failed = "it failed: RuntimeError: gloo: connection reset"
    assert cause([failed, None, DIED, failed, DIED]) == (2, DIED)
    assert cause([None, failed, "it failed: other"]) == (1, failed)
    assert cause([None, None, None]) is None
