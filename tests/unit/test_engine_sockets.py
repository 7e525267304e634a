"""vLLM's engines keep their ZeroMQ sockets in one private folder (rl_core.artifacts.paths.vllm_ipc_dir),
which sheds the sockets of engines killed before their shutdown, not in the temp folder itself."""

from __future__ import annotations

import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.artifacts.paths import shed_dead_sockets, vllm_env, vllm_ipc_dir


def _socket_file(path: Path, *, listening: bool) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    if listening:
        s.listen(1)
        return s
    s.close()  # the file stays, as a killed engine's does
    return None


@pytest.fixture
def temp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder with a short path (pytest's own are too long for a socket's 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="rlf-t-", dir="/tmp"))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_long_temp_folder_falls_back_to_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("x" * 60)))
    assert Path(vllm_ipc_dir()).parent == Path("/tmp")


def test_dead_sockets_go_and_live_ones_stay(temp_root: Path) -> None:
    folder = Path(vllm_ipc_dir())
    assert folder.parent == temp_root and stat.S_IMODE(folder.stat().st_mode) == 0o700
    _socket_file(folder / "dead", listening=False)
    live = _socket_file(folder / "live", listening=True)
    (folder / "note").write_text("not a socket")
    try:
        assert vllm_ipc_dir() == str(folder)
        assert sorted(p.name for p in folder.iterdir()) == ["live", "note"]
    finally:
        assert live is not None
        live.close()
    vllm_ipc_dir()  # its process gone, the next engine's start sheds it
    assert sorted(p.name for p in folder.iterdir()) == ["note"]


def test_a_given_folder_wins_and_is_left_alone(monkeypatch: pytest.MonkeyPatch, temp_root: Path) -> None:
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(temp_root))
    _socket_file(temp_root / "dead", listening=False)
    assert vllm_env()["VLLM_RPC_BASE_PATH"] == str(temp_root)
    assert (temp_root / "dead").is_socket()


def test_vllm_names_its_sockets_in_the_folder(temp_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    monkeypatch.setenv("VLLM_RPC_BASE_PATH", vllm_env()["VLLM_RPC_BASE_PATH"])
    path = get_open_zmq_ipc_path()
    assert path.startswith(f"ipc://{temp_root}/rlfoundry-vllm-"), path


def test_only_the_dead_sockets_of_the_pattern_go(temp_root: Path) -> None:
    """What the S3 server's start and stop use for the sockets weed leaves in /tmp."""
    _socket_file(temp_root / "seaweedfs-s3-1.sock", listening=False)
    _socket_file(temp_root / "other-2.sock", listening=False)
    live = _socket_file(temp_root / "seaweedfs-master-grpc-3.sock", listening=True)
    (temp_root / "seaweedfs-note.sock").write_text("a file, not a socket")
    try:
        assert shed_dead_sockets(temp_root, "seaweedfs-*.sock") == 1
    finally:
        assert live is not None
        live.close()
    left = sorted(p.name for p in temp_root.iterdir())
    assert left == ["other-2.sock", "seaweedfs-master-grpc-3.sock", "seaweedfs-note.sock"]


def test_a_gone_servers_temp_folder_goes_and_the_rest_stay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A rollout server's temp folder (infra.rollout_servers.server_scratch) is removed once its server is
    gone; a live server's, a start in progress (no record yet) and what this code did not write stay."""
    import json
    import os
    import time

    import psutil

    from infra.localstack.process import Server
    from infra.rollout_servers import OWNER, SCRATCH_ORPHAN_S, server_scratch, shed_server_scratch

    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    me = Server("live", os.getpid(), psutil.Process().create_time(), tmp_path / "log")
    gone = Server("gone", me.pid, me.create_time - 5.0, tmp_path / "log")  # the pid, reused since
    folders = {name: server_scratch() for name in ("live", "gone", "starting", "orphan", "foreign")}
    assert all(f.parent == tmp_path and f.name.startswith("server-") for f in folders.values())
    (folders["live"] / OWNER).write_text(json.dumps(me.record()))
    (folders["gone"] / OWNER).write_text(json.dumps(gone.record()))
    (folders["gone"] / "vllm_dist_0").write_text("a file store")
    (folders["foreign"] / OWNER).write_text("not a record")
    old = time.time() - SCRATCH_ORPHAN_S - 1
    os.utime(folders["orphan"], (old, old))
    assert shed_server_scratch() == 1
    assert sorted(n for n, f in folders.items() if f.exists()) == ["foreign", "live", "starting"]
