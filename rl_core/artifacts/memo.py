"""What a ``Store`` (rl_core.artifacts.store) remembers between calls in one process: an LRU of what it worked
out (parsed tables, verified folders, files read) that a pickled store does not carry, and the file stats
that say a verified folder or a file read before is unchanged."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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


class Seen:
    """Local files read before, by path: their stats then and what was made of them (a manifest's JSON, the
    digest a table's bytes were verified against). The stages of an iteration read ~30 manifests and ~10
    tables, each several times; a file whose stats are those it was read with is not opened again (one
    ``stat`` instead of an open, a read and a hash), by the rule of verified folders (``file_stats``,
    ``settled``). What it holds is shared by every reader: callers build their own objects from it, never
    change it."""

    def __init__(self, size: int):
        self.memo = Memo(size)

    def stats(self, path: str) -> tuple | None:
        """``file_stats`` of the one file ``path``; None when it is missing."""
        p = Path(path)
        return file_stats(p.parent, [p.name])

    def get(self, path: str, stats: tuple) -> Any:
        """What was made of ``path`` when it had these ``stats``; None if it was not remembered so."""
        hit = self.memo.get(path)
        return hit[1] if hit is not None and hit[0] == stats else None

    def put(self, path: str, stats: tuple, began_ns: int, value: Any) -> None:
        """Remember ``value``, made of ``path`` read after it was seen with ``stats`` at ``began_ns``."""
        if settled(stats, began_ns):
            self.memo.put(path, (stats, value))

    def read(self, path: str, make: Callable[[], Any]) -> Any:
        """``make()`` (what reading ``path`` gives), or what it gave before while the file is unchanged;
        None when there is no file."""
        began = time.time_ns()
        stats = self.stats(path)
        if stats is None:
            return None
        value = self.get(path, stats)
        if value is None:
            value = make()
            self.put(path, stats, began, value)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return (Seen, (self.memo.size,))
