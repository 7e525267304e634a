"""The dataset environment's verifiers (``envs/dataset.py``): what an answer is checked with. ``math``
(math-verify), ``numeric``, ``exact``, each on the text after the reasoning block (``math`` and ``numeric``
pay only the one value an answer commits to: ``envs/commitment.py``); and ``code``: a row's own
tests — MBPP's assert lines or HumanEval's ``check(candidate)`` — run against the answer's code in the
sandbox, through HumanEval's hardened harness (``envs/humaneval.py``: a fresh sandbox run per answer, the
function called through a proxy that hands back only plain literals, a one-time nonce), the batch in one
pool map; a row's prompt of Python definitions whose helpers the tests call runs beside them, as HumanEval's
does (``trusted_prompt``)."""

from __future__ import annotations

import ast
import builtins
import keyword
import re
from typing import Any

from envs.commitment import Verdict, math_verdict, numeric_verdict


# -- answers -------------------------------------------------------------------------------------------
def final_answer(completion: str) -> str | None:
    """What the verifier reads: the text after the last ``</think>``; None when a ``<think>`` never closes
    (one opened again after the last close included).

    >>> final_answer("<think>2+2 is 4</think> The answer is 4"), final_answer("<think>hmm"), final_answer("5")
    (' The answer is 4', None, '5')
    >>> final_answer("<think>a</think><think>b")
    """
    tail = completion.rsplit("</think>", 1)[-1]
    return None if "<think>" in tail else tail


def check(verifier: str, answer: str, text: str) -> Verdict:
    """(correct, well formed, what was parsed, hedge) of an answer text against the ground truth: ``math``
    and ``numeric`` pay only the one value the text commits to (``envs.commitment``: a hedge scores 0)."""
    if verifier == "math":
        return math_verdict(answer, text)
    if verifier == "numeric":
        return numeric_verdict(answer, text)
    got_text, want_text = " ".join(text.split()), " ".join(answer.split())
    return Verdict(bool(got_text) and got_text == want_text, bool(got_text), got_text[:200])


# -- code ---------------------------------------------------------------------------------------------

_CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(")  # a name called (not a method: no "." before)
# called in a test but not the function under test: set(f(x)) == ..., round(f(x), 2) == ...
_NOT_ENTRY = frozenset(dir(builtins)) | frozenset(keyword.kwlist)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def code_tests(tests: Any, entry: str | None, name: str, i: int) -> tuple[str, str]:
    """(source defining ``check(candidate)``, the function under test) of a row's tests: assert lines (a list,
    or one text of them) become the body of ``check``; a text that defines ``check`` is taken as it is and
    needs ``entry``. The tests call the function by its name (the harness binds it to the candidate): without
    ``entry``, the first name the asserts call that is not a builtin (``_entry``).

    >>> src, entry = code_tests(["assert add(1, 2) == 3", "assert add(0, 0) == 0"], None, "f", 0)
    >>> entry, src.splitlines()[0], src.splitlines()[1].strip()
    ('add', 'def check(candidate):', 'assert add(1, 2) == 3')
    """
    if isinstance(tests, str) and "def check(" in tests:
        if not entry:
            raise ValueError(
                f"task.env_args: {name}: row {i} defines check(candidate) but names no function "
                "(set entry_field)"
            )
        src = tests
    else:
        lines = [str(t) for t in tests] if isinstance(tests, list) else str(tests).splitlines()
        lines = [ln for ln in lines if ln.strip()]
        if not lines or not all(ln.lstrip().startswith(("assert", "import ", "from ")) for ln in lines):
            raise ValueError(
                f"task.env_args: {name}: row {i}: the tests are neither assert lines nor check(candidate)"
            )
        if not entry:
            called = _entry(lines)
            if called is None:
                raise ValueError(
                    f"task.env_args: {name}: row {i}: no assert calls a function (set entry_field)"
                )
            entry = called
        src = "def check(candidate):\n" + "".join(f"    {ln.strip()}\n" for ln in lines)
    if not _IDENT.fullmatch(entry):
        raise ValueError(f"task.env_args: {name}: row {i}: {entry!r} is not a function name")
    return src, entry


def _entry(lines: list[str]) -> str | None:
    """The function the assert lines test: the first name they call that is not a Python builtin (else the
    first builtin called: a function under test named like one).

    >>> _entry(["assert set(similar(a, b)) == {1}"]), _entry(["assert round(area(1), 2) == 3.14"])
    ('similar', 'area')
    >>> _entry(["assert not is_odd(2)", "assert is_odd(1)"]), _entry(["import math", "assert abs(-1) == 1"])
    ('is_odd', 'abs')
    """
    called = [m[1] for ln in lines if ln.lstrip().startswith("assert") for m in _CALLED.finditer(ln)]
    return next((c for c in called if c not in _NOT_ENTRY), None) or next(
        (c for c in called if not keyword.iskeyword(c)), None
    )


def solution_code(prompt: Any, text: str, entry: str) -> str:
    r"""The module the tests import: the last fenced code block of the answer (else the answer itself); a
    completion that continues a prompt defining the function (HumanEval's form) is the prompt plus it.

    >>> solution_code("Write add.", "Here:\n```python\ndef add(a, b):\n    return a + b\n```", "add")
    'def add(a, b):\n    return a + b\n'
    >>> solution_code("def add(a, b):\n", "    return a + b", "add")
    'def add(a, b):\n    return a + b'
    """
    fenced = _FENCE.findall(text)
    code = fenced[-1] if fenced else text
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry)}\s*\(", re.M)
    if isinstance(prompt, str) and defines.search(prompt) and not defines.search(code):
        return prompt + code
    return code


def trusted_prompt(prompt: Any, test: str, entry: str) -> str:
    r"""The row's prompt as trusted code the tests run beside, as HumanEval's harness runs its prompt: when
    the prompt is Python of definitions (functions, classes, imports, assignments, a docstring) and the
    tests use a name it defines besides ``entry`` (HumanEval/38's ``encode_cyclic``, /32's ``poly``); else
    "" (a prompt in words, chat messages, or helpers the tests do not need: nothing of it runs).

    >>> helper = "def encode(s):\n    return s[::-1]\n\n\ndef decode(s):\n    'Undo encode.'\n"
    >>> test = "def check(candidate):\n    assert candidate(encode('ab')) == 'ab'\n"
    >>> trusted_prompt(helper, test, "decode") == helper, trusted_prompt("Write decode.", test, "decode")
    (True, '')
    """
    if not isinstance(prompt, str):
        return ""
    try:
        tree, used = ast.parse(prompt), {n.id for n in ast.walk(ast.parse(test)) if isinstance(n, ast.Name)}
    except (SyntaxError, ValueError, RecursionError):
        return ""
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return ""  # a statement that does something: not a prompt of definitions
    return prompt if (defined - {entry}) & used else ""


def code_outcomes(
    pairs: list[tuple[dict[str, Any], str]], workers: int | None = None
) -> list[dict[str, Any]]:
    """The outcomes of (task, answer text) pairs of ``verifier: code``: one sandbox pool map for the batch."""
    from envs.humaneval import run_programs

    programs = [
        (
            trusted_prompt(t["prompt"], t["test"], t["entry"]),
            t["test"],
            t["entry"],
            solution_code(t["prompt"], text, t["entry"]),
        )
        for t, text in pairs
    ]
    out = []
    for passed, flags, infra in run_programs(programs, workers=workers):
        out.append(
            {
                "correct": passed,
                "well_formed": "syntax_error" not in flags,
                "parsed": "",
                "flags": flags,
                "infra_error": infra,
            }
        )
    return out
