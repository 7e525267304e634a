"""The HumanEval test harness, run as ``main.py`` inside the sandbox (stdlib only; executed by the sandbox's
``python3 -I -S -B main.py``, never imported by rlfoundry).

The model's code and the problem's tests never share an interpreter:

    harness --fork--> runner: closes its stdin, points its stdout at stderr, imports solution.py, then
                      answers call requests: each an argument tuple (repr), each answer the return value's
                      repr, or the name of what it raised
    harness: becomes non-dumpable, reads the nonce, the prompt, the tests and the entry point from stdin (only
             now, after the fork), runs the prompt (its helper functions) and the tests in its own
             namespace with ``candidate`` a proxy that forwards each call to the runner, and parses each
             answer as a plain literal (numbers, strings, bytes, None, booleans, and tuples, lists, sets and
             dicts of them); prints "<1|0> <status> <nonce>" as its last line

So whatever the solution does in its own process — patch builtins, rebind ``AssertionError``, edit
``sys.modules``, define objects whose ``__eq__`` is always true, exit early, print "all tests passed" —
nothing of it reaches the interpreter that runs ``assert``: the tests compare plain values the harness built
itself. A reply that is not a plain literal fails the test (status ``non_plain_return``). The runner never
holds the tests, the expected values or the nonce (they reach the harness after the fork, on a stdin the
runner has closed; the harness is non-dumpable, the sandbox's seccomp refuses ptrace and
process_vm_readv), and no file in the sandbox holds them. Statuses: ok, assertion_failed, raised (the tests
raised something else), exited_before_tests (the runner exited before answering every call), crashed (killed
by a signal), import_error, missing_function, non_plain_return, timeout (past ``budget_s``), flood (an
answer over 1 MiB).
"""

import ast
import builtins
import ctypes
import json
import os
import select
import sys
import time

_PR_SET_DUMPABLE = 4
_SIGKILL = 9
_MAX_REPLY = 1 << 20
_SAFE_RAISE = {
    n: getattr(builtins, n)
    for n in ("ValueError", "TypeError", "IndexError", "KeyError", "ZeroDivisionError", "AssertionError")
}


class _Stop(BaseException):
    """The runner cannot answer any more: ``status`` says why. A BaseException, so a test's ``except
    Exception`` cannot swallow it; once raised, every later call raises it again."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _send(fd, text):
    data = text.encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(fd, data) :]


def _runner(request_fd, reply_fd):
    """The forked runner: trusted code up to ``import solution``."""
    empty_r, empty_w = os.pipe()
    os.close(empty_w)
    os.dup2(empty_r, 0)
    os.dup2(2, 1)
    for fd in range(3, 256):
        if fd not in (request_fd, reply_fd):
            try:  # noqa: SIM105
                os.close(fd)
            except OSError:
                pass
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    entry = requests.readline().strip()
    sys.path.insert(0, "/work")
    try:
        import solution  # noqa: PLC0415  (the model's code: only now, in this process)
    except SystemExit:
        _finish(reply_fd, "!exited\n")
    except BaseException as e:  # noqa: BLE001
        sys.stderr.write(f"{type(e).__name__} while importing the solution\n")
        _finish(reply_fd, "!import_error\n")
    fn = getattr(solution, entry, None)
    if not callable(fn):
        _finish(reply_fd, "!missing_function\n")
    _send(reply_fd, "!ready\n")
    for line in requests:
        try:
            # rlfoundry's own literal (the tests' arguments); this process runs the model's code
            text = repr(fn(*eval(line, {"__builtins__": {}, "inf": float("inf"), "nan": float("nan")})))  # noqa: S307
            _send(reply_fd, ("!multiline" if "\n" in text else text) + "\n")
        except SystemExit:
            _finish(reply_fd, "!exited\n")
        except BaseException as e:  # noqa: BLE001
            _send(reply_fd, f"!raised {type(e).__name__}\n")
    _finish(reply_fd, "")


def _finish(reply_fd, text):
    try:  # noqa: SIM105
        _send(reply_fd, text)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001, S110
        pass
    os._exit(0)


_NAMES = {"inf": float("inf"), "nan": float("nan"), "None": None, "True": True, "False": False}


def _plain(node):
    """The value of a literal expression node; anything else raises ValueError."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _plain(node.operand)
        if type(v) in (int, float, complex):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return ast.literal_eval(node)  # complex: 1+2j
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_plain(e) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_plain(k): _plain(v) for k, v in zip(node.keys, node.values, strict=True)}
    call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords
    if call and node.func.id in ("set", "frozenset") and len(node.args) <= 1:
        return {"set": set, "frozenset": frozenset}[node.func.id](*[_plain(a) for a in node.args])
    raise ValueError("not a plain literal")


def _read_line(fd, state, deadline):
    """The runner's next answer line (without its newline); raises _Stop when it cannot come."""
    try:
        return _next_line(fd, state, deadline)
    except _Stop as stop:
        state["stopped"] = stop.status
        raise


def _next_line(fd, state, deadline):
    while b"\n" not in state["buf"]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Stop("timeout")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise _Stop("eof")
        state["buf"] += chunk
        if len(state["buf"]) > _MAX_REPLY:
            raise _Stop("flood")
    line, _, state["buf"] = state["buf"].partition(b"\n")
    return line.decode("utf-8", "replace")


def _proxy(request_fd, reply_fd, deadline):
    state = {"buf": b""}

    def candidate(*args, **kwargs):
        if state.get("stopped"):
            raise _Stop(state["stopped"])
        if kwargs:
            raise TypeError("the tests call the candidate with keyword arguments")
        _send(request_fd, repr(args).replace("\n", " ") + "\n")
        line = _read_line(reply_fd, state, deadline)
        if line == "!exited":
            state["stopped"] = "eof"
            raise _Stop("eof")
        if line.startswith("!raised "):
            raise (_SAFE_RAISE.get(line[8:]) or RuntimeError)(line[8:])
        try:
            return _plain(ast.parse(line, mode="eval").body)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            state["stopped"] = "non_plain_return"
            raise _Stop("non_plain_return") from None

    return candidate, state


def _tests(spec, request_fd, reply_fd, deadline):
    """Run the prompt and the tests against the runner: the status."""
    _send(request_fd, spec["entry"] + "\n")
    candidate, state = _proxy(request_fd, reply_fd, deadline)
    first = _read_line(reply_fd, state, deadline)
    if first != "!ready":
        return {"!exited": "eof", "!import_error": "import_error"}.get(first, "missing_function")
    namespace = {"__name__": "tests"}
    exec(compile(spec["prompt"], "prompt.py", "exec"), namespace)  # noqa: S102  (the dataset's, trusted)
    namespace[spec["entry"]] = candidate  # a test may name the function itself (HumanEval/33)
    exec(compile(spec["test"], "tests.py", "exec"), namespace)  # noqa: S102
    try:
        namespace["check"](candidate)
    except _Stop as stop:
        return stop.status
    except AssertionError:
        return state.get("stopped") or "assertion_failed"
    except Exception:  # noqa: BLE001
        return state.get("stopped") or "raised"
    return state.get("stopped") or "ok"


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
            os._exit(1)
    os.close(request_r)
    os.close(reply_w)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    nonce, spec = sys.stdin.readline().strip(), json.loads(sys.stdin.read())
    try:
        status = _tests(spec, request_w, reply_r, time.monotonic() + float(spec["budget_s"]))
    except _Stop as stop:  # before the tests: the runner ended or stalled while importing the solution
        status = stop.status
    except OSError:  # the runner closed its end: it is gone
        status = "eof"
    os.kill(pid, _SIGKILL)
    _, wait_status = os.waitpid(pid, 0)
    if status == "eof":
        signalled = os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) != _SIGKILL
        status = "crashed" if signalled else "exited_before_tests"
    sys.stdout.write(f"\n{int(status == 'ok')} {status} {nonce}\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
