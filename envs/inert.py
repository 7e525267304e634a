"""Whether an answer is safe to hand to a scorer that evaluates it.

Some third-party scorers run the model's answer as code: several of reasoning-gym's call ``eval`` on it
(``string_insertion``, ``spiral_matrix``, ``binary_matrix``, ``n_queens``: "is it a Python list?") or sympy's
``parse_expr`` (``polynomial_multiplication``, the integration tasks, ``puzzle24``, ``countdown``), which is
``eval`` after sympy's token transformations (``n!`` becomes ``factorial(n)``, unknown names ``Symbol(...)``).
The model writes that text, so under RL it is untrusted code, run in the trainer's own process, where it can
read the gold answer from the scorer's frame or patch the scorer for every later answer.

``hazard`` reads the text both ways it may be evaluated (as Python, and as ``parse_expr``'s transformed
code, made by sympy's own ``stringify_expr`` without evaluating it) and names anything that is more than
arithmetic on literals and symbols:

- a call of anything but the elementary functions (``sin``, ``exp``, ``sqrt``...) and sympy's number and
  symbol constructors; attribute access; a name that starts with ``_``; subscripts; lambdas, comprehensions,
  assignment expressions;
- a number too large to compute: every constant subexpression's size is bounded from its literals (a power
  multiplies its base's digits by its exponent), and over ``MAX_DIGITS`` digits it is refused, so
  ``9**9**9**9``, ``1 << 10**9`` and ``(10**5000)!`` never reach the interpreter.

A text that neither reading parses cannot be evaluated by either (both raise first), so prose is untouched.

    >>> hazard("-3*x**3 + sin(x) + C") is None, hazard("__import__('os').system('id')")
    (True, 'calls the result of an expression')
    >>> hazard("open('/etc/passwd')"), hazard("5!")  # the second: parse_expr's factorial notation
    ('calls open', 'calls factorial')
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Iterator
from typing import Any

MAX_DIGITS = 10_000
MAX_CHARS = 20_000

# What an answer may call: the elementary functions and sympy's constructors of numbers and symbols (which
# parse_expr's transformations write around every literal and unknown name).
SAFE_CALLS = frozenset(
    {
        "Symbol",
        "Integer",
        "Float",
        "Rational",
        "Abs",
        "abs",
        "sign",
        "sqrt",
        "cbrt",
        "root",
        "exp",
        "log",
        "ln",
    }
    | {f"{a}{f}" for a in ("", "a") for f in ("sin", "cos", "tan", "cot", "sec", "csc")}
    | {f"{a}{f}h" for a in ("", "a") for f in ("sin", "cos", "tan", "cot")}
)
_FORBIDDEN = (ast.Attribute, ast.Subscript, ast.Lambda, ast.NamedExpr, ast.Starred, ast.Await, ast.Yield)
_FORBIDDEN += (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.JoinedStr, ast.YieldFrom)


def hazard(text: str) -> str | None:
    """Why evaluating ``text`` (as Python or through sympy's ``parse_expr``) could do more than arithmetic on
    literals and symbols, or None when it could not."""
    if len(text) > MAX_CHARS:
        return f"an answer of {len(text)} characters (more than {MAX_CHARS}) is not evaluated"
    for code in _readings(text):
        try:
            tree = ast.parse(code.strip(), mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue  # not an expression this way: evaluating it raises before anything runs
        why = _check(tree.body)
        if why is not None:
            return why
    return None


def _readings(text: str) -> Iterator[str]:
    yield text
    from sympy.parsing.sympy_parser import standard_transformations, stringify_expr

    try:
        yield stringify_expr(text, {}, _sympy_globals(), standard_transformations)
    except Exception:  # sympy's tokenizer or a transformation refuses it: parse_expr raises the same
        return


@functools.cache
def _sympy_globals() -> dict[str, Any]:
    """The namespace ``parse_expr`` builds when given none (its transformations read it)."""
    import builtins
    import types

    names: dict[str, Any] = {}
    exec("from sympy import *", names)
    names.update({k: v for k, v in vars(builtins).items() if isinstance(v, types.BuiltinFunctionType)})
    return names


def _check(node: ast.AST) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, _FORBIDDEN):
            return f"{type(sub).__name__.lower()} in the answer"
        if isinstance(sub, ast.Name) and sub.id.startswith("_"):
            return f"the name {sub.id}"
        if isinstance(sub, ast.Call):
            name = sub.func.id if isinstance(sub.func, ast.Name) else None
            if name not in SAFE_CALLS:
                return f"calls {name or 'the result of an expression'}"
    try:
        digits = _digits(node)
    except RecursionError:
        return "an expression nested too deeply"
    if digits > MAX_DIGITS:
        return (
            f"a value too large to evaluate (up to {_shown(digits)} digits or elements; {MAX_DIGITS} at most)"
        )
    return None


def _shown(digits: float) -> str:
    return f"{digits:,.0f}" if digits < 1e15 else "astronomically many"


def _digits(node: ast.AST) -> float:
    """An upper bound of the size of the value of ``node``: decimal digits for a number (a symbol counts as
    one), elements for a list or string (so a repeated list is bounded like a power)."""
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, str | bytes):
            return float(len(v))
        if isinstance(v, bool) or not isinstance(v, int | float | complex):
            return 1.0
        mag = abs(v)
        return math.inf if mag != mag or mag == math.inf else math.log10(mag + 1) + 1
    if isinstance(node, ast.UnaryOp):
        return _digits(node.operand)
    if isinstance(node, ast.BinOp):
        left, right = _digits(node.left), _digits(node.right)
        if isinstance(node.op, ast.Pow | ast.LShift):  # base^e, 2^e: e < 10^(digits(e) - 1)
            base = left if isinstance(node.op, ast.Pow) else 1.0
            return math.inf if right > 16 else base * 10 ** (right - 1)
        if isinstance(node.op, ast.Mult) and (_sequence(node.left) or _sequence(node.right)):
            return (
                math.inf if min(left, right) > 16 else max(left * 10 ** (right - 1), right * 10 ** (left - 1))
            )
        if isinstance(node.op, ast.Add | ast.Sub | ast.BitOr | ast.BitXor | ast.BitAnd):
            return max(left, right) + 1
        return left + right  # *, /, //, %, @, >>: no more digits than both together
    parts = [_digits(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
    if isinstance(node, ast.Call):  # a constructor or an elementary function of its arguments
        return sum(parts[1:]) if len(parts) > 1 else 1.0
    if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
        return sum(parts) + 1
    return max(parts, default=1.0)  # comparisons, boolean operators, conditionals


def _sequence(node: ast.AST) -> bool:
    """Whether ``node`` may be a list, tuple or string (which ``*`` repeats)."""
    if isinstance(node, ast.List | ast.Tuple) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    ):
        return True
    return isinstance(node, ast.BinOp | ast.IfExp | ast.BoolOp) and any(
        _sequence(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)
    )
