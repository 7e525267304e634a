"""The test harness of the code environment, run as ``main.py`` inside the sandbox (stdlib only; executed by
the sandbox's ``python3 -I -S -B main.py``, never imported by rlfoundry).

Two processes, so the model's code never shares memory with the hidden tests:

    harness --fork--> runner: closes its stdin, points its stdout at stderr, waits for the inputs,
                      then imports solution.py and calls the function on each input, one repr line each
    harness: becomes non-dumpable, reads the tests and the nonce from stdin (only now, after the fork),
             sends the runner the inputs (never the expected outputs), compares each answer it gets back
             with the expected value, and prints "<passed> <total> <status> <nonce>" as its last line

The runner never holds the expected outputs or the nonce: they reach the harness after the fork, on a stdin
the runner has closed, and the harness's memory, fds and environment are out of its reach (non-dumpable:
/proc refuses them; the sandbox's seccomp filter refuses ptrace and process_vm_readv). The runner's own stdout
is the sandbox's stderr, so nothing it prints can reach the harness's stdout, and what it sends back is text:
the harness compares each line with the expected value's ``repr`` as strings (no object of the model's ever
reaches the comparison, and nothing it sends is parsed). A runner that exits, crashes, loops or floods fails
the tests it did not answer. The harness does not import from /work (``-I``),
so a module the runner writes there is never imported by the harness.

Answers are compared by ``repr``, so types count (``True`` is not ``1``, ``2.0`` is not ``2``, a tuple is not
a list). Protocol on stdin, one item a line, all written by rlfoundry: the nonce, the function's name,
``budget_s``, the number of tests N, N lines of argument tuples (``repr``), N lines of expected ``repr``s.
Status: ok (every input answered), import_error, missing_function, crashed (the runner ended without
answering every input), timeout (the runner ran past ``budget_s``), flood (more than 1 MiB of reply).
Imports are few and light (no json, re, enum): the interpreter's start is most of a run's cost.
"""

import ctypes
import os
import select
import sys
import time

_PR_SET_DUMPABLE = 4
_SIGKILL = 9
_MAX_REPLY = 1 << 20
_STATUSES = ("!import_error", "!missing_function")


def _send(fd, text):
    data = text.encode("utf-8", "backslashreplace")
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
            try:  # noqa: SIM105  (contextlib costs an import: see above)
                os.close(fd)
            except OSError:
                pass
    entry, *inputs = _read_all(request_fd).decode().split("\n")[:-1]
    os.close(request_fd)
    sys.path.insert(0, "/work")
    try:
        import solution  # noqa: PLC0415  (the model's code: only now, in this process)
    except BaseException as e:  # noqa: BLE001  (anything it raises, SystemExit included, is its failure)
        sys.stderr.write(f"{type(e).__name__} while importing the solution\n")
        _finish(reply_fd, "!import_error\n")
    fn = getattr(solution, entry, None)
    if not callable(fn):
        _finish(reply_fd, "!missing_function\n")
    for line in inputs:
        try:
            # rlfoundry's own literal (a tuple of ints, strings, lists); this process runs the model's code
            text = repr(fn(*eval(line, {"__builtins__": {}})))  # noqa: S307
            _send(reply_fd, ("!multiline" if "\n" in text else text) + "\n")
        except BaseException as e:  # noqa: BLE001
            _send(reply_fd, f"!raised {type(e).__name__}\n")
    _finish(reply_fd, "")


def _finish(reply_fd, text):
    """Send the last reply and flush what the runner printed (to the sandbox's stderr), then exit."""
    try:  # noqa: SIM105  (contextlib costs an import)
        _send(reply_fd, text)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001, S110  (the model may have replaced the streams: its loss)
        pass
    os._exit(0)


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _collect(fd, deadline):
    """The runner's reply until it closes its end, the deadline or the size limit."""
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


def _score(data, expected):
    """(passed, status) from the runner's reply: complete lines only, compared as strings."""
    lines = data.decode("utf-8", "replace").split("\n")[:-1][: len(expected)]
    if lines and lines[0] in _STATUSES:
        return 0, lines[0][1:]
    passed = sum(line == want for line, want in zip(lines, expected, strict=False))
    return passed, "ok" if len(lines) == len(expected) else "crashed"


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
    nonce, entry, budget, n, *rest = sys.stdin.buffer.read().decode().split("\n")
    n = int(n)
    inputs, expected = rest[:n], rest[n : 2 * n]
    t0 = time.monotonic()
    try:  # noqa: SIM105  (the runner may be gone already: then it answered nothing)
        _send(request_w, "\n".join([entry, *inputs]) + "\n")
    except OSError:
        pass
    os.close(request_w)
    data, stop = _collect(reply_r, t0 + float(budget))
    os.kill(pid, _SIGKILL)
    os.waitpid(pid, 0)
    passed, status = _score(data, expected)
    if stop is not None and status in ("ok", "crashed"):
        status = stop
    sys.stdout.write(f"\n{passed} {n} {status} {nonce}\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
