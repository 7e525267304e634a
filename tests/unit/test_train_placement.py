"""train.world_size / train.tp_size: which layouts are refused, and why they are placement (left out of the
run's config hash, so a run resumes at another world size without --force)."""

from __future__ import annotations

import pytest

from rl_core.artifacts.store import Store
from rl_core.run.context import RunContext, run_config_hash
from rl_core.run.runs import RunError, create_or_resume
from rl_core.schema.config import ConfigError, config_from_dict


def _cfg(**train):
    return config_from_dict({"experiment": {"name": "t"}, "train": train})


@pytest.mark.parametrize(
    "train,field",
    [
        ({"world_size": 3, "tp_size": 2}, "must divide train.world_size"),
        ({"world_size": 2, "tp_size": 2, "zero_stage": 3}, "AutoTP is not ZeRO-3"),
        ({"world_size": 2, "backend": "torch"}, "need train.backend=deepspeed"),
        ({"world_size": 2, "checkpoint_every": 2}, "checkpoint_every > 1 needs train.world_size=1"),
        ({"world_size": 2, "algorithm": "ppo"}, "train.algorithm=ppo"),
    ],
)
def test_unworkable_layouts_are_refused_naming_the_field(train, field):
    with pytest.raises(ConfigError, match=field):
        _cfg(**train)


def test_placement_is_not_in_the_run_hash_but_everything_else_is():
    one = _cfg()
    assert not one.train.launched and _cfg(world_size=2).train.launched
    assert _cfg(world_size=2, tp_size=2).train.launched
    assert run_config_hash(_cfg(world_size=4, tp_size=2, zero_stage=1)) == run_config_hash(_cfg(zero_stage=1))
    assert run_config_hash(one) != run_config_hash(_cfg(zero_stage=1))
    assert run_config_hash(one) != run_config_hash(_cfg(lr=2e-4))


def test_a_run_resumes_at_another_world_size_without_force(tmp_path):
    store = Store(f"file://{tmp_path}")
    assert create_or_resume(RunContext(_cfg(world_size=2), "r1", store), "new") == "created"
    assert create_or_resume(RunContext(_cfg(), "r1", store), "resume") == "resumed"
    with pytest.raises(RunError, match="train.lr"):
        create_or_resume(RunContext(_cfg(lr=2e-4), "r1", store), "resume")
