"""Fault injection for crash tests: ``RLFOUNDRY_FAULT=<point>@<iteration>`` SIGKILLs this process there.

Points: ``<stage>:start`` (body begins), ``<stage>:outputs`` (outputs written, manifest not yet),
``<stage>:committed`` (manifest written), ``write`` (half-way through writing an artifact file of that
iteration's folder), ``sync`` (before a weight sync into the rollout engine). A ``:node`` suffix kills this
process's parent first: for a rank in a Ray actor, its node's raylet (the node is lost); ``:abort`` ends the
process with SIGABRT instead (a native library's abort), and with ``RLFOUNDRY_FAULT_ONCE=FILE`` only while
FILE does not exist (it is created then). Unset in normal runs: a no-op.
The caller says which iteration it is in; nothing is remembered between calls.

    RLFOUNDRY_FAULT=train:outputs@2 rlfoundry run configs/smoke.yaml --run-id r1   # dies
    rlfoundry resume r1                                                          # continues
"""

from __future__ import annotations

import os
import re
import signal

_ITER = re.compile(r"/iter-(\d{4,})/")


def iteration_of(uri: str) -> int | None:
    """The iteration whose stage folder ``uri`` lies in (``.../iter-0003/train/...`` -> 3), else None.

    >>> iteration_of("file:///s/run/iter-0003/train/optimizer.safetensors"), iteration_of("file:///s/run/run.json")
    (3, None)
    """
    m = _ITER.search(uri)
    return int(m.group(1)) if m else None


def fault(point: str, iteration: int | None) -> None:
    spec = os.environ.get("RLFOUNDRY_FAULT")
    if not spec:
        return
    where, _, at = spec.partition("@")
    at, _, scope = at.partition(":")
    if where == point and (not at or int(at) == iteration):
        once = os.environ.get("RLFOUNDRY_FAULT_ONCE")
        if once:
            try:
                with open(once, "x"):
                    pass
            except FileExistsError:
                return
        if scope == "node":
            os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGABRT if scope == "abort" else signal.SIGKILL)
