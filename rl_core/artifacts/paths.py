"""Where rlfoundry keeps its state: ``$RLFOUNDRY_STATE_DIR`` or ``.state/`` in the project folder.

The store, MLflow's SQLite database, Prefect's home and the engine caches all live under it, so one folder
holds everything a run wrote (delete it to start clean).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def state_dir() -> Path:
    d = Path(os.environ.get("RLFOUNDRY_STATE_DIR") or PROJECT_ROOT / ".state").resolve()
    d.mkdir(parents=True, exist_ok=True)
    return d


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_dir(name: str) -> Path:
    """A cache shared by every run on this machine (compiled ops, downloaded checkpoints)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlfoundry" / name
    base.mkdir(parents=True, exist_ok=True)
    return base


def torch_extensions_dir() -> str:
    """Where torch's JIT-compiled C++ ops (DeepSpeed's CPU communication op) are kept:
    ``TORCH_EXTENSIONS_DIR`` when set, else one folder per machine (``cache_dir``): each compiled once."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(cache_dir("torch_extensions"))


def vllm_cache_root() -> str:
    """vLLM's cache (what it learnt inspecting a model class, ~10 s of a fresh interpreter per engine start
    when cold; compiled graphs): ``VLLM_CACHE_ROOT`` when set, else one folder per machine beside the compiled
    ops, shared by every run and state dir (vLLM writes its entries atomically)."""
    return os.environ.get("VLLM_CACHE_ROOT") or str(cache_dir("vllm"))


def vllm_ipc_dir() -> str:
    """Where vLLM's engines put their ZeroMQ sockets (``VLLM_RPC_BASE_PATH``; vLLM's default is the temp
    folder itself): ``VLLM_RPC_BASE_PATH`` when set, else one private folder per user in the temp folder. An
    engine killed before its shutdown leaves its sockets behind (the suite left ~100 in /tmp a run): each call
    removes those no process listens on any more, so the folder holds the live engines' sockets."""
    given = os.environ.get("VLLM_RPC_BASE_PATH")
    if given:
        return given
    import tempfile

    base = tempfile.gettempdir()  # a socket's path has 107 bytes at most: /tmp when the temp folder's is long
    folder = Path(base if len(base) <= 48 else "/tmp") / f"rlfoundry-vllm-{os.geteuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    shed_dead_sockets(folder)
    return str(folder)


def shed_dead_sockets(folder: Path, pattern: str = "*") -> int:
    """Remove this user's Unix sockets matching ``pattern`` in ``folder`` on which no process listens any
    more (left by a server killed before its shutdown); returns how many went."""
    gone = 0
    for entry in folder.glob(pattern):
        try:
            mine = entry.is_socket() and entry.lstat().st_uid == os.geteuid()
        except OSError:
            continue  # removed meanwhile
        if mine and not _listened_on(entry):
            entry.unlink(missing_ok=True)
            gone += 1
    return gone


def _listened_on(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at ``path``."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # not ours to judge (a full backlog, a permission): keep it
    return True


def vllm_env() -> dict[str, str]:
    """The folders a vLLM engine process uses (``vllm_cache_root``, ``vllm_ipc_dir``), as environment."""
    return {"VLLM_CACHE_ROOT": vllm_cache_root(), "VLLM_RPC_BASE_PATH": vllm_ipc_dir()}


def configure_env() -> None:
    """Process defaults set before Prefect, MLflow and vLLM are imported: state under the state dir,
    quiet logs, telemetry off. Values already in the environment win."""
    s = state_dir()
    defaults = {
        "PREFECT_HOME": str(s / "prefect"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # The flow and task runs' own lines (stages, iterations, alarms) reach the Prefect UI at INFO; the
        # console still prints warnings only (the CLI's progress display is the console's).
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_LOGGING_LEVEL": "WARNING",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
        **vllm_env(),
        "TOKENIZERS_PARALLELISM": "false",
        "TQDM_DISABLE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
        "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    import logging
    import warnings

    # Library chatter (deprecations, "accelerator set to CPU") would bury the progress display.
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("DeepSpeed", "deepspeed", "vllm", "torch.distributed", "transformers", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
