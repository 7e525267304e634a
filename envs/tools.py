"""Tool use over several turns: two-step arithmetic the model solves by calling tools.

A task is ``a*b+c`` (or ``a*b-c``) with two-digit ``a``, ``b``. The model may call

- ``calc(EXPR)``: a calculator for integers with ``+ - *`` (parsed, never ``eval``-ed), answers ``=VALUE``;
- ``py(CODE)``: a Python interpreter that runs CODE in the sandbox (``envs.sandbox``), answers ``=STDOUT``;
- ``ans(VALUE)``: the final answer, which ends the episode.

One call per turn. The tasks are built to take two tool calls (the product, then the sum) before the answer,
so three turns; the answer is paid however it was reached, and ``calls`` is reported for rewards that
require them. Anything that is not a well-formed call gets an ``error: ...`` observation and the
episode goes on (up to ``max_turns``); it never raises. Deterministic: the same actions give the same
observations (the py tool's hash seed is fixed; only code that reads the system's randomness, ``os.urandom``
or an unseeded ``random``, differs between runs).

    env = ToolUseEnv()
    env.reset({"prompt": "Q:12*34+5\\n", "answer": "413", ...}, seed=0)
    env.step("calc(12*34)").observation      # "=408\\n"
    env.step("calc(408+5)").observation      # "=413\\n"
    env.step("ans(413)").outcome["correct"]  # True
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from envs.base import StepResult, draw_tasks

_CALL = re.compile(r"^\s*(calc|py|ans)\((.*)\)\s*$", re.S)
_TOKEN = re.compile(r"\s*(\d+|[-+*()])")
MAX_VALUE = 10**12


class CalcError(ValueError):
    pass


def calculate(expr: str) -> int:
    """Evaluate an integer expression with + - * and parentheses (recursive descent, no eval).

    Long: the grammar's three nested rules (expression, term, factor) share the cursor and its bounds
    checks; kept together so the whole parser of untrusted model output reads in one screen.

    >>> calculate("12*34+5"), calculate("-(3-10)*2")
    (413, 14)
    """
    if len(expr) > 64:
        raise CalcError("expression too long")
    pos = 0
    toks: list[str] = []
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            if expr[pos:].strip() == "":
                break
            raise CalcError(f"unexpected {expr[pos : pos + 8]!r}")
        toks.append(m.group(1))
        pos = m.end()
    i = 0

    def peek() -> str | None:
        return toks[i] if i < len(toks) else None

    def take() -> str:
        nonlocal i
        if i >= len(toks):
            raise CalcError("unexpected end")
        i += 1
        return toks[i - 1]

    def atom() -> int:
        t = take()
        if t == "(":
            v = expr_()
            if take() != ")":
                raise CalcError("missing )")
            return v
        if t == "-":
            return -atom()
        if t.isdigit():
            return int(t)
        raise CalcError(f"unexpected {t!r}")

    def term() -> int:
        v = atom()
        while peek() == "*":
            take()
            v *= atom()
            if abs(v) > MAX_VALUE:
                raise CalcError("value too large")
        return v

    def expr_() -> int:
        v = term()
        while peek() in ("+", "-"):
            op = take()
            v = v + term() if op == "+" else v - term()
        return v

    if not toks:
        raise CalcError("empty expression")
    v = expr_()
    if i != len(toks):
        raise CalcError(f"unexpected {toks[i]!r}")
    return v


@functools.cache
def _sandbox() -> Any:
    """One sandbox worker process for this process's py calls (a long-lived caller must not run sandboxes
    itself: see ``Sandbox(dedicated=...)``)."""
    from envs.sandbox.core import configured_mode
    from envs.sandbox.pool import SandboxPool

    return SandboxPool(1, configured_mode())


MAX_CODE = 16 * 1024  # characters of one py call
# The py tool's Python, its hash seed fixed: a printed set or hash() is the same in the episode and its replay
# (a random seed would make an honest episode a replay mismatch). The sandbox's environment is cleared and
# set to a fixed few; env adds only this one, which python's -E (the sandbox's default argv) would ignore.
PY_ARGV = ["/usr/bin/env", "PYTHONHASHSEED=0", "/usr/bin/python3", "-s", "main.py"]


def run_python(code: str) -> str:
    """The py tool: CODE (at most ``MAX_CODE`` characters) in a fresh sandbox (2 s, 128 MiB); its stdout or an
    error line, never an exception."""
    from envs.sandbox import Limits, SandboxUnavailable

    if len(code) > MAX_CODE:
        return f"error: code longer than {MAX_CODE} characters\n"
    try:
        r = _sandbox().map(
            [{"files": {"main.py": code}, "argv": PY_ARGV}],
            Limits(timeout_s=2, memory_mb=128, output_bytes=256, disk_mb=1),
        )[0]
    except SandboxUnavailable:
        return "error: python tool unavailable\n"
    if r.stopped_reason:
        return f"error: {r.stopped_reason}\n"
    if r.exit_code != 0:
        last = (r.stderr.strip().splitlines() or ["failed"])[-1]
        return f"error: {last[:48]}\n"
    return "=" + r.stdout.strip()[:48] + "\n"


class ToolUseEnv:
    name = "tooluse"
    max_turns = 5

    def __init__(self) -> None:
        self._task: dict[str, Any] | None = None
        self._calls = 0
        self._errors = 0

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        def draw(rng: random.Random) -> dict[str, Any]:
            a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(1, 99)
            sign = rng.choice("+-")
            ans = a * b + c if sign == "+" else a * b - c
            return {
                "prompt": f"Q:{a}*{b}{sign}{c}\n",
                "answer": str(ans),
                "a": a,
                "b": b,
                "c": c,
                "sign": sign,
            }

        return draw_tasks("tooluse", split, task_cfg, seed, draw)

    def reset(self, task: dict[str, Any], seed: int) -> str:
        self._task, self._calls, self._errors = task, 0, 0
        return task["prompt"]

    def _outcome(self, answer: str | None) -> dict[str, Any]:
        assert self._task is not None
        return {
            "parsed": answer or "",
            "well_formed": answer is not None,
            "correct": answer is not None and answer == self._task["answer"],
            "calls": self._calls,
            "errors": self._errors,
        }

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        m = _CALL.match(action)
        if not m:
            self._errors += 1
            return StepResult("error: expected calc(...), py(...) or ans(...)\n", False, self._outcome(None))
        tool, arg = m.group(1), m.group(2).strip()
        if tool == "ans":
            ok = re.fullmatch(r"-?[0-9]{1,64}", arg) is not None
            if not ok:
                self._errors += 1
                return StepResult("error: ans needs an integer\n", False, self._outcome(None))
            return StepResult(None, True, self._outcome(str(int(arg))))
        self._calls += 1
        if tool == "calc":
            try:
                obs = f"={calculate(arg)}\n"
            except CalcError as e:
                self._errors += 1
                obs = f"error: {e}\n"
        else:
            obs = run_python(arg)
        return StepResult(obs, False, self._outcome(None))

    # -- warm-up and tokenizer ----------------------------------------------------------------------
    def demonstration(self, task: dict[str, Any], flawed: bool) -> list[tuple[str, bool]]:
        """A worked episode as (text, is_model_turn) segments. The flawed teacher forgets the second call
        and answers the product."""
        a, b, c, sign = task["a"], task["b"], task["c"], task["sign"]
        p = a * b
        segs = [(task["prompt"], False), (f"calc({a}*{b})", True), (f"={p}\n", False)]
        if flawed:
            return [*segs, (f"ans({p})", True)]
        r = p + c if sign == "+" else p - c
        return [*segs, (f"calc({p}{sign}{c})", True), (f"={r}\n", False), (f"ans({r})", True)]

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        """Texts the tokenizer is trained on: every demonstration segment and the tool vocabulary."""
        texts = [
            "error: expected calc(...), py(...) or ans(...)\n",
            "error: ans needs an integer\n",
            "error: unexpected end\n",
            "error: missing )\n",
            "error: timeout\n",
            "py(print(1))",
        ]
        for t in tasks:
            texts += [s for s, _ in self.demonstration(t, False)]
        return texts
