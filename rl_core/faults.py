"""Fault injection for crash tests: ``RLFOUNDRY_FAULT=<point>@<iteration>`` SIGKILLs this process there.

Points: ``<stage>:start`` (body begins), ``<stage>:outputs`` (outputs written, manifest not yet),
``<stage>:committed`` (manifest written), ``write`` (half-way through writing an artifact file),
``sync`` (before a weight sync into the rollout engine). Unset in normal runs: a no-op.

    RLFOUNDRY_FAULT=train:outputs@2 rlfoundry run configs/smoke.yaml --run-id r1   # dies
    rlfoundry resume r1                                                          # continues
"""

from __future__ import annotations

import os
import signal

_iteration: list[int] = [-1]


def set_iteration(iteration: int) -> None:
    _iteration[0] = iteration


def fault(point: str) -> None:
    spec = os.environ.get("RLFOUNDRY_FAULT")
    if not spec:
        return
    where, _, at = spec.partition("@")
    if where == point and (not at or int(at) == _iteration[0]):
        os.kill(os.getpid(), signal.SIGKILL)
