"""A fork server for the suite's `rlfoundry` processes: one interpreter that has imported torch, transformers,
DeepSpeed, pandas and pyarrow forks a child per command, so a command starts in ~0.1 s instead of paying
~10 s of imports (most of a smoke run's cost on two cores; the suite starts over a hundred of them).

Each child is a real process of its own (``python -m flows.cli ARGS`` as ``runpy`` runs it: its own pid,
environment, working directory, stdout/stderr files, exit status; a SIGKILL ends only it), so a crash test
kills the child and resume runs in another. What is shared is only what those libraries (and vLLM) did at
import time, which reads no setting a test varies (the server imports nothing that reads one then: not
Prefect, which the child imports itself with its own environment; vLLM and MLflow read theirs when used, but
for constants set below, the same for every command). Tests that are about the program as a fresh
interpreter (the smoke run, ``--help``'s import time) start one with ``subprocess`` instead.

The server is started by the first ``tests.conftest.cli`` call of a pytest process and dies with it. Protocol,
one JSON line per connection: {"args", "env", "cwd", "stdout", "stderr"} -> {"pid"}, then {"status"} (the
child's wait status) once it ended. The OpenMP runtime read its settings in the server, so a child's OMP_*
variables do not apply (the suite sets OMP_WAIT_POLICY for the server too). ``RLFOUNDRY_TEST_FORK=0`` runs
every command with ``subprocess``. A child finds the server in ``RLFOUNDRY_TEST_FORKSERVER`` and forks its own
commands from it (``python``: a benchmark smoke's arms, through ``benchmarks.common.python``).

    python -m tests.forkserver SOCKET_PATH      # what ForkServer.start runs
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Set in every child's environment: the server's socket, so that a child (a benchmark starting its arms)
# forks its own commands from the same server (``python``).
ENV_VAR = "RLFOUNDRY_TEST_FORKSERVER"
# Imported once by the server: the heavy part of a command's imports that reads no setting a test varies,
# then every module of rl_core and envs (neither reads the environment at import; neither imports Prefect).
PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "pyarrow.parquet",
    "scipy",
    "sympy",
    "safetensors.torch",
    "transformers",
    "transformers.generation.utils",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.llama.modeling_llama",
    "deepspeed",  # imports MLflow too: its import-time settings are the constant ones below
    # vLLM reads its settings when an engine starts (vllm.envs is lazy), but for its logger's: constant below.
    # It imports Ray, whose settings are read at ray.init.
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.model_executor.models.registry",
)
PACKAGES = ("rl_core", "envs")
# Never imported by the server: it reads settings a test sets (Prefect's API URL and home) at import.
NOT_PRELOADED = ("prefect",)
# What rl_core.artifacts.paths.configure_env sets before libraries import, the same for every command.
IMPORT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_NO_USAGE_STATS": "1",
}
# What the preloaded imports wrote into os.environ (vLLM sets a few variables for torch at import): a child
# gets them over its own environment, as its own import would have set them.
IMPORTED_ENV: dict[str, str] = {}


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict) -> int:
    """In the forked child: become ``python -m flows.cli ARGS`` (or ``python SCRIPT ARGS``); its exit code."""
    import runpy

    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    # What a new interpreter starts with: SIGINT raises KeyboardInterrupt, SIGPIPE is ignored (a write to a
    # closed pipe or socket raises BrokenPipeError, which the HTTP clients retry). With SIGPIPE at its default
    # a child died silently (-13) when the Prefect server closed a kept-alive connection under it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(IMPORTED_ENV)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    script = request.get("script")
    sys.argv = [script or "rlfoundry", *request["args"]]
    if script:  # as `python SCRIPT`: its folder first on the path
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    code: int | str | None = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 (reported as the interpreter would, exit 1)
        import traceback

        traceback.print_exc()
        code = 1
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    return int(code or 0)


def serve(path: str) -> int:
    """The server's loop: accept, fork, report each child's pid and then its wait status."""
    import importlib
    import pkgutil

    os.environ.update(IMPORT_ENV)
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            importlib.import_module(info.name)
    IMPORTED_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    leaked = [m for m in NOT_PRELOADED if m in sys.modules]
    if leaked:
        print(f"forkserver: the preload imported {leaked}; refusing to fork", file=sys.stderr)
        return 3
    # Forking a process with other Python threads could leave one of their locks held in the child: none may
    # run. The few native threads the imports start (pyarrow's jemalloc background thread, torch's) idle in
    # libraries that are forked this way every day (a DataLoader forks its workers beside them; the
    # allocators have fork handlers); no torch op has run, so no OpenMP team exists to be lost.
    if threading.active_count() != 1:
        print(f"forkserver: {_threads()} threads after the imports; refusing to fork", file=sys.stderr)
        return 3
    # The preloaded heap (millions of objects) moves to the collector's permanent generation: a child's
    # collections (vLLM alone calls gc.collect() several times per engine) scan only what the child made, and
    # its pages stay shared with the server (nothing writes their GC headers).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    parent = os.getppid()
    while os.getppid() == parent:  # the pytest process that started it is gone: stop
        for _key, _events in sel.select(timeout=0.05):
            conn, _ = listener.accept()
            with conn.makefile("rb") as f:
                request = json.loads(f.readline())
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                conn.close()
                return _child(request)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        for pid in list(waiting):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = waiting.pop(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                conn.close()
    for pid in waiting:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return 0


class ForkServer:
    """The server as the test process sees it: ``run(args, env, timeout)`` -> ``CompletedProcess``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.path = str(workdir / "fork.sock")
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "forkserver.log", "wb")  # noqa: SIM115 (lives as long as the server)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "VLLM_"))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", self.path], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 180
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the fork server did not start: {(self.workdir / 'forkserver.log').read_text()}"
                )
            time.sleep(0.05)

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        timeout: float,
        script: str | None = None,
        cwd: Path = ROOT,
    ) -> subprocess.CompletedProcess:
        """``rlfoundry ARGS`` (or ``python SCRIPT ARGS``, SCRIPT relative to the checkout) as a child in
        ``cwd``; the child finds the server in ``ENV_VAR`` and may start its own commands the same way
        (``forked``)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
        return forked(self.path, args, {**env, ENV_VAR: self.path}, timeout, script, cwd)


def forked(
    path: str,
    args: list[str],
    env: dict[str, str],
    timeout: float,
    script: str | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess:
    """``rlfoundry ARGS`` (or ``python SCRIPT ARGS``) forked by the server listening on ``path``, output
    captured: what ``subprocess.run`` would give. A timeout SIGKILLs the child."""
    workdir = Path(path).parent
    fd, out_name = tempfile.mkstemp(dir=workdir, suffix=".out")
    os.close(fd)
    out, err = Path(out_name), Path(out_name).with_suffix(".err")
    request = {"args": args, "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
    if script:
        request["script"] = script
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(json.dumps(request).encode() + b"\n")
            f = s.makefile("rb")
            pid = json.loads(f.readline())["pid"]
            s.settimeout(timeout)
            try:
                line = f.readline()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([*args], timeout) from None
            status = json.loads(line)["status"]
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
    finally:
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
    return subprocess.CompletedProcess([script or "rlfoundry", *args], code, stdout, stderr)


def python(
    argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """``python ARGV`` (``SCRIPT ARGS`` or ``-m flows.cli ARGS``), output captured: forked by the suite's
    server when this process is one of its children (``ENV_VAR`` set), else a new interpreter."""
    env = dict(os.environ if env is None else env)
    path = env.get(ENV_VAR)
    if path and os.path.exists(path):
        if argv[:2] == ["-m", "flows.cli"]:
            return forked(path, argv[2:], env, timeout or 24 * 3600, cwd=cwd)
        if argv and argv[0].endswith(".py"):
            return forked(path, argv[1:], env, timeout or 24 * 3600, script=argv[0], cwd=cwd)
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
