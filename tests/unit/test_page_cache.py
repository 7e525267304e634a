"""A local store hands the page-cache pages of the large state files it wrote back to the kernel once they
are on disk (rl_core.artifacts.page_cache), and nothing about the files changes."""

from __future__ import annotations

import os
import pickle

import pytest

from rl_core.artifacts.page_cache import WrittenPages, drop_pages
from rl_core.artifacts.store import Store


@pytest.fixture
def advised(monkeypatch):
    """The files ``posix_fadvise`` is called on, in order, with DONTNEED (any other advice fails the test)."""
    seen: list[str] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED and (offset, length) == (0, 0)
        seen.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    return seen


def test_large_writes_start_their_writeback_and_hand_back_the_ones_before(tmp_path, advised):
    s = Store(str(tmp_path))
    s.pages = WrittenPages(min_bytes=1000, after_s=0.0)
    small = s.write_bytes(s.root + "/r/_manifest.json", b"{}")
    table = s.write_bytes(s.root + "/r/iter-0001/generate/rollouts.parquet", os.urandom(5000))
    little = s.write_bytes(s.root + "/r/iter-0001/train/critic.safetensors", os.urandom(500))
    assert advised == []  # manifests and tables, however large, stay cached (the next stages read them)
    a = s.write_bytes(s.root + "/r/iter-0001/train/optimizer.safetensors", os.urandom(5000))
    assert advised == ["optimizer.safetensors"]
    b = s.write_bytes(s.root + "/r/iter-0002/train/model.safetensors", os.urandom(3000))
    assert advised == ["optimizer.safetensors", "optimizer.safetensors", "model.safetensors"]
    # the files are whole and match their references, read from wherever the kernel has them
    for ref in (small, table, little, a, b):
        assert s.read_bytes(ref)


def test_a_file_written_moments_ago_keeps_its_pages_until_its_writeback_had_time(tmp_path, advised):
    s = Store(str(tmp_path))
    s.pages = WrittenPages(min_bytes=1000, after_s=3600.0)
    s.write_bytes(s.root + "/r/a.safetensors", os.urandom(2000))
    s.write_bytes(s.root + "/r/b.safetensors", os.urandom(2000))
    # each one's writeback started; a.safetensors not handed back yet
    assert advised == ["a.safetensors", "b.safetensors"]
    assert [p.rsplit("/", 1)[-1] for p, _ in s.pages._written] == ["a.safetensors", "b.safetensors"]


def test_a_file_gone_before_its_hand_back_is_left_alone(tmp_path, advised):
    pages = WrittenPages(min_bytes=10, after_s=0.0)
    gone = tmp_path / "gone.safetensors"
    gone.write_bytes(b"x" * 100)
    pages.wrote(str(gone), 100)
    gone.unlink()
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"y" * 100)
    pages.wrote(str(kept), 100)  # no error for the missing one
    assert advised == ["gone.safetensors", "kept.safetensors"]
    drop_pages(str(gone))  # nor when called directly


def test_the_real_call_leaves_the_bytes_as_written(tmp_path):
    data = os.urandom(3 << 20)
    s = Store(str(tmp_path))
    s.pages = WrittenPages(after_s=0.0)
    ref = s.write_bytes(s.root + "/r/big.safetensors", data)
    s.write_bytes(s.root + "/r/next.safetensors", os.urandom(2 << 20))  # hands big.safetensors' pages back
    assert s.read_bytes(ref) == data


def test_a_store_sent_to_another_process_has_written_nothing(tmp_path):
    s = Store(str(tmp_path))
    s.write_bytes(s.root + "/r/big.safetensors", os.urandom(2 << 20))
    assert len(s.pages._written) == 1
    copy = pickle.loads(pickle.dumps(s))
    assert copy.pages._written == [] and copy.pages.suffixes == s.pages.suffixes
