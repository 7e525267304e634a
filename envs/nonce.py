"""The nonce protocol that tells a finished test harness from a program that only pretends to be one.

A harness run in the sandbox (``envs/humaneval.py``, ``envs/code/``) is given a one-time nonce on stdin, never
in a file, and prints it as the last thing it does, after the tests. Its verdict here: it finished only when
it exited 0 *and* its stdout ends with the nonce. Model-written code that exits early (``sys.exit(0)``,
``os._exit(0)``) or prints a success message of its own therefore does not pass: it cannot know the nonce.
What the harness prints on the nonce's line before the nonce (e.g. how many tests passed) is as trustworthy as
the nonce itself (``nonce_line``).

Covers: early exit with status 0, forged success output, a run stopped by a limit (timeout, memory, output).
Does not cover: code that can read the harness's memory (a test harness that calls the code in its own process
leaves the nonce within reach of frame walking; ``envs/code/harness.py`` calls it in a separate process).

    nonce = new_nonce()
    passed, flags = verdict(sandbox_result, nonce)
"""

from __future__ import annotations

import secrets
from typing import Any

_MARKERS = (
    ("SyntaxError", "syntax_error"),
    ("IndentationError", "syntax_error"),
    ("AssertionError", "assertion_failed"),
    ("MemoryError", "memory"),
)


def new_nonce() -> str:
    """A fresh 128-bit nonce (hex)."""
    return secrets.token_hex(16)


def verdict(result: Any, nonce: str) -> tuple[bool, list[str]]:
    """(finished, flags) of one sandbox result (``SandboxResult``): finished = exit 0, stdout ending with the
    nonce, not timed out; flags name what went wrong (the sandbox's stop reason, markers in stderr,
    ``exited_before_tests`` for an exit 0 without the nonce)."""
    flags: list[str] = []
    if result.stopped_reason:
        flags.append(result.stopped_reason)
    tail = result.stderr[-2000:]
    for marker, flag in _MARKERS:
        if marker in tail and flag not in flags:
            flags.append(flag)
    ended_with_nonce = result.stdout.rstrip("\n").endswith(nonce)
    if result.exit_code == 0 and not ended_with_nonce:
        flags.append("exited_before_tests")  # exit 0 without the harness finishing: reward hacking
    elif result.exit_code not in (0, None) and not flags:
        flags.append("error")
    return result.exit_code == 0 and ended_with_nonce and not result.timed_out, flags


def nonce_line(stdout: str, nonce: str) -> str | None:
    """What the harness wrote on the nonce's line before the nonce, or None when stdout does not end with it.

    >>> nonce_line("noise\\n3 5 ok abc\\n", "abc"), nonce_line("3 5 ok abc\\nmore\\n", "abc")
    ('3 5 ok', None)
    """
    last = stdout.rstrip("\n").rsplit("\n", 1)[-1]
    if not last.endswith(nonce):
        return None
    return last[: -len(nonce)].strip()
