"""Large state files a local store wrote, handed out of the page cache once they are on disk.

The train stage writes its checkpoint and optimizer state at every step (12.7 MB for the default 1M-parameter
policy; gigabytes for a real one), and the run reads them again only within the next iteration (its generate,
its train stage's input check); a replay or a resume reads them from disk. Left in the page cache, a run's
checkpoints fill it, pushing out what is read again (models, datasets), and every new write takes pages the
kernel has not handed out before, which a virtual machine's host must fault in: on this project's 2-core
machines a step's 12.7 MB took 22.8 ms so, 4.8 ms into pages handed back (``benchmarks/page_cache.py``).

So after each large write of a state file (weights, optimizer or critic state: ``.safetensors``, which the
run holds in memory; not the tables, manifests and images the next stages read) the store asks the kernel
to write the file back now (``POSIX_FADV_DONTNEED`` on a file still dirty starts its writeback without
waiting), and at each later such write hands back the pages of the state files written at least ``after_s``
before (written back by then; a file still being written back keeps its pages, as it would have anyway). The
next writes reuse those pages. Nothing about a file changes but where its bytes are read from.

    pages = WrittenPages()
    pages.wrote("/store/run/iter-0003/train/optimizer.safetensors", 8_454_664)
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def drop_pages(path: str) -> None:
    """``POSIX_FADV_DONTNEED`` on the file at ``path``: its clean pages leave the page cache, its dirty ones
    start being written back. A file gone since, or a system without ``posix_fadvise``, is left alone."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class WrittenPages:
    """The large state files one local store wrote lately, whose pages it hands back (thread-safe: the
    write-behind thread writes too). ``suffixes``: the names of state files; ``min_bytes``: smaller ones stay
    cached; ``after_s``: how long a file's writeback is given before its pages are handed back."""

    def __init__(
        self, min_bytes: int = 1 << 20, after_s: float = 0.05, suffixes: tuple[str, ...] = (".safetensors",)
    ):
        self.min_bytes, self.after_s, self.suffixes = min_bytes, after_s, suffixes
        self._lock = threading.Lock()
        self._written: list[tuple[str, float]] = []  # (path, when written), oldest first

    def wrote(self, path: str, size: int) -> None:
        """After ``size`` bytes were written at ``path``: for a large state file, hand back the pages of those
        written ``after_s`` or more before it, then start its own writeback."""
        if size < self.min_bytes or not path.endswith(self.suffixes):
            return
        now = time.monotonic()
        with self._lock:
            due = [p for p, t in self._written if now - t >= self.after_s]
            self._written = [(p, t) for p, t in self._written if now - t < self.after_s] + [(path, now)]
        for p in due:
            drop_pages(p)
        drop_pages(path)

    def __reduce__(self) -> tuple[Any, ...]:
        # a store sent to another process starts with none: its files are the ones it writes itself
        return (WrittenPages, (self.min_bytes, self.after_s, self.suffixes))
