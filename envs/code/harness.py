"""The test harness of the code environment, run as ``main.py`` inside the sandbox (stdlib only; executed by
the sandbox's ``python3 -I -S -B main.py``, never imported by rlfoundry).

Two processes, so the model's code never shares memory with the hidden tests:

    harness --fork--> runner: closes its stdin, points its stdout at stderr, waits for the inputs,
                      then imports solution.py and calls the function on each input, one JSON line each
    harness: becomes non-dumpable, reads the tests and the nonce from stdin (only now, after the fork),
             sends the runner the inputs (never the expected outputs), compares each answer it gets back
             with the expected value, and prints "<passed> <total> <status> <nonce>" as its last line

The runner never holds the expected outputs or the nonce: they reach the harness after the fork, on a stdin
the runner has closed, and the harness's memory, fds and environment are out of its reach (non-dumpable:
/proc refuses them; the sandbox's seccomp filter refuses ptrace and process_vm_readv). The runner's own stdout
is the sandbox's stderr, so nothing it prints can reach the harness's stdout, and what it sends back is parsed
as JSON data (plain values; no object of the model's ever reaches the comparison). A runner that exits,
crashes, loops or floods fails the tests it did not answer. The harness does not import from /work (``-I``),
so a module the runner writes there is never imported by the harness.

Answers are compared as canonical JSON, so types count (``True`` is not ``1``, ``2.0`` is not ``2``).
Protocol on stdin: one JSON object ``{"nonce", "entry", "inputs": [[arg, ...], ...], "expected": [...],
"budget_s"}``. Status: ok (every input answered), import_error, missing_function, crashed (the runner ended
without answering every input), timeout (the runner ran past ``budget_s``), flood (more than 1 MiB of reply).
"""

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time

_PR_SET_DUMPABLE = 4
_MAX_REPLY = 1 << 20


def _send(fd, obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _runner(request_fd, reply_fd):
    """The forked runner: trusted code up to ``import solution``."""
    empty_r, empty_w = os.pipe()  # stdin: an empty pipe (the sandbox's /dev/null is not openable)
    os.close(empty_w)
    os.dup2(empty_r, 0)
    os.dup2(2, 1)
    for fd in range(3, 256):
        if fd not in (request_fd, reply_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
    request = json.loads(_read_all(request_fd))
    os.close(request_fd)
    sys.path.insert(0, "/work")
    try:
        import solution  # noqa: PLC0415  (the model's code: only now, in this process)
    except BaseException as e:  # noqa: BLE001  (anything it raises, SystemExit included, is its failure)
        sys.stderr.write(f"{type(e).__name__} while importing the solution\n")
        _send(reply_fd, {"status": "import_error", "error": type(e).__name__})
        _flush()
        os._exit(0)
    fn = getattr(solution, request["entry"], None)
    if not callable(fn):
        _send(reply_fd, {"status": "missing_function"})
        _flush()
        os._exit(0)
    for args in request["inputs"]:
        try:
            reply = {"value": fn(*args)}
            _send(reply_fd, reply)
        except BaseException as e:  # noqa: BLE001
            _send(reply_fd, {"raised": type(e).__name__})
    _flush()
    os._exit(0)


def _flush():
    """What the runner printed, out to the sandbox's stderr before ``os._exit`` (for whoever reads it)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _collect(fd, deadline):
    """The runner's reply lines until it closes its end, the deadline or the size limit."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, "timeout"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return data, None
        data += chunk
        if len(data) > _MAX_REPLY:
            return data, "flood"


def _canonical(value):
    return json.dumps(value, sort_keys=True)


def _score(lines, expected):
    """(passed, answered, status) from the runner's reply lines."""
    passed = answered = 0
    for i, line in enumerate(lines[: len(expected)]):
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if not isinstance(reply, dict):
            continue
        if "status" in reply:  # the runner's own word: only a known status counts
            status = reply["status"] if reply["status"] in ("import_error", "missing_function") else "crashed"
            return passed, answered, status if i == 0 else "crashed"
        answered += 1
        if "value" in reply and _canonical(reply["value"]) == _canonical(expected[i]):
            passed += 1
    return passed, answered, "ok" if answered == len(expected) else "crashed"


def main():
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(request_w)
            os.close(reply_r)
            _runner(request_r, reply_w)
        finally:
            os._exit(1)  # the runner never returns into the harness's code
    os.close(request_r)
    os.close(reply_w)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    spec = json.loads(sys.stdin.buffer.read())
    t0 = time.monotonic()
    with contextlib.suppress(OSError):  # the runner may be gone already: then it answered nothing
        _send(request_w, {"entry": spec["entry"], "inputs": spec["inputs"]})
    os.close(request_w)
    data, stop = _collect(reply_r, t0 + float(spec["budget_s"]))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    lines = [x for x in data.split(b"\n") if x.strip()]
    passed, answered, status = _score(lines, spec["expected"])
    if stop is not None and status in ("ok", "crashed"):
        status = stop
    sys.stdout.write(f"\n{passed} {len(spec['expected'])} {status} {spec['nonce']}\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
