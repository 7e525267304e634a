"""What a ``Store`` (rl_core.artifacts.store) remembers between calls in one process: an LRU of what it worked
out (parsed tables, verified folders) that a pickled store does not carry, and the file stats that say a
verified folder is unchanged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class Memo:
    """What a ``Store`` already worked out, by key (the last ``size``; thread-safe): parsed tables by the
    sha256 of their verified bytes (parsing a parquet file costs ~8 ms however small it is, reading and
    hashing its bytes well under one), and local folders verified against their digest. A pickled copy (a
    store sent to another process) starts empty."""

    def __init__(self, size: int):
        import threading
        from collections import OrderedDict

        self.size, self.lock, self.items = size, threading.Lock(), OrderedDict()

    def get(self, key: str) -> Any:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
            return self.items.get(key)

    def put(self, key: str, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Memo, (self.size,))


def file_stats(path: Path, names: list[str]) -> tuple | None:
    """(name, inode, size, mtime in ns) of each file, None when one is missing: a folder whose stats are
    those it was verified with holds the bytes it was verified with, provided none of them was written in
    the last moments before (``settled``)."""
    try:
        return tuple((n, (st := os.stat(path / n)).st_ino, st.st_size, st.st_mtime_ns) for n in names)
    except FileNotFoundError:
        return None


# A file's mtime is taken from a clock that moves in ticks (1-10 ms on Linux): a file rewritten in place, to
# the same size, within the tick of its verification would keep its stats. Stats are trusted only for files
# last written well before the verification began (as git treats "racily clean" files).
SETTLE_NS = 50_000_000


def settled(stats: tuple, since_ns: int) -> bool:
    """Whether every file of ``stats`` was last written at least ``SETTLE_NS`` before ``since_ns``."""
    return all(mtime < since_ns - SETTLE_NS for *_, mtime in stats)
