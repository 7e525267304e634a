"""Every launched rank on its own device (issue 43, item 1): the flow plans once and hands its placement to
the ranks in the job file; rank r trains on ``cuda:LOCAL_RANK`` of the trainer GPUs its launcher made visible,
never on the engine's, on described 8-GPU machines with and without ``rollout.gpus``. A rank does not plan
again: the GPUs it sees are its job's, not the machine's (re-planning there gave every rank the first GPU,
and refused a config with ``rollout.gpus``)."""

from __future__ import annotations

import json

import pytest

from rl_core.models.placement import Machine, Placement, PlacementError, plan
from rl_core.schema.config import config_from_dict
from rl_core.training.train_launch import _env

EIGHT = Machine.described("H200", 8)
BF16 = {"dtype": "bf16", "zero_stage": 1}


def _cfg(**sections):
    return config_from_dict({"experiment": {"name": "t"}, **sections})


def _through_the_job_file(p: Placement) -> Placement:
    return Placement.from_dict(json.loads(json.dumps(p.as_dict())))


@pytest.mark.parametrize(
    "sections,trainer,engine",
    [
        ({"train": {**BF16, "world_size": 6}, "rollout": {"gpus": [6, 7]}}, (0, 1, 2, 3, 4, 5), "cuda:6"),
        ({"train": {**BF16, "world_size": 8}}, tuple(range(8)), "cuda:0"),  # colocated, the engine sleeps
        ({"train": {**BF16, "world_size": 4}, "rollout": {"gpus": [0, 1]}}, (2, 3, 4, 5), "cuda:0"),
    ],
)
def test_rank_r_trains_on_its_own_gpu(sections, trainer, engine):
    flow = plan(_cfg(**sections), EIGHT)
    assert flow.trainer_gpus == trainer and flow.workloads["rollout"].device == engine
    env = _env(len(trainer), flow.trainer_gpus)
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert visible == [str(g) for g in trainer]  # the launcher shows the ranks the trainer's GPUs only
    job = _through_the_job_file(flow)
    assert job == flow
    devices = []
    for r in range(len(trainer)):
        mine = job.for_rank(r)
        assert {mine.workloads[w].device for w in ("trainer", "reference", "critic")} == {f"cuda:{r}"}
        assert mine.workloads["rollout"] == flow.workloads["rollout"]  # the engine stays where it was
        assert mine.workloads["trainer"].dtype == "bfloat16"
        devices.append(int(visible[int(mine.workloads["trainer"].device.split(":")[1])]))
    assert devices == list(trainer)  # one physical GPU per rank, each of the trainer's once


def test_a_rank_that_planned_again_would_be_wrong():
    """Why the placement travels: the machine a rank sees (its job's GPUs) plans every rank onto its first
    GPU, and refuses ``rollout.gpus`` outright."""
    cfg = _cfg(train={**BF16, "world_size": 6}, rollout={"gpus": [6, 7]})
    seen_by_a_rank = Machine.described("H200", 6)
    with pytest.raises(PlacementError, match="rollout.gpus"):
        plan(cfg, seen_by_a_rank)
    cfg = _cfg(train={**BF16, "world_size": 8})
    replanned = plan(cfg, EIGHT)
    assert {replanned.workloads["trainer"].device} == {"cuda:0"}  # the same for every rank


def test_on_the_cpu_a_rank_keeps_the_flows_placement():
    flow = plan(_cfg(train={"world_size": 2}), Machine(cpu_threads=2))
    assert _through_the_job_file(flow).for_rank(1) == flow
