"""Progress events from a running experiment to whoever listens (the CLI's live table), in-process.

subscribe(lambda event: print(event))
emit({"kind": "iteration", "iteration": 3, "mean_reward": 0.4})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_LISTENERS: list[Callable[[dict[str, Any]], None]] = []


def subscribe(fn: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    _LISTENERS.append(fn)
    return lambda: _LISTENERS.remove(fn)


def emit(event: dict[str, Any]) -> None:
    for fn in list(_LISTENERS):
        fn(event)
