"""The code environment's task family: small Python functions that rlfoundry generates itself.

A template is one kind of function (``affine``: "Return x times {a} plus {b}.", solved by
``    return x * {a} + {b}``); a task is a template with its constants drawn. The prompt is the signature and
a docstring with one worked example; the hidden tests are ``hidden_tests`` other inputs with their expected
outputs, which the prompt does not show, so code that special-cases the visible example fails them. The
solution is always a one-line body. A task's split is decided by a hash of its function (template and
constants, ``key``), not of its prompt, so no held-out function is ever trained on under another example.

The flawed teacher (the warm-up's demonstrations) makes one systematic mistake: it writes the first constant
plus one (``x * 38 + 5`` for "times 37 plus 5"), which fails every hidden test; the hidden inputs of the
comparison templates straddle the constant, so ``x > 8`` for "greater than 7" fails too.

>>> task = make_task(TEMPLATES["affine"], [37, 5], [[4], [0], [1], [2], [3], [5]], "affine:37,5")
>>> task["prompt"].splitlines()
['def affine(x):', '    \"\"\"Return x times 37 plus 5.', '    >>> affine(4)', '    153', '    \"\"\"']
>>> task["answer"], flawed_answer(task)
('    return x * 37 + 5', '    return x * 38 + 5')
>>> task["inputs"], task["expected"]
([[0], [1], [2], [3], [5]], [5, 42, 79, 116, 190])
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envs.base import draw_tasks

_WORD = string.ascii_lowercase[:8]


@dataclass(frozen=True)
class Template:
    """One kind of function. ``body`` and ``doc`` are formatted with the constants ``a`` (and ``b``);
    ``ref(*constants)`` is the reference function (trusted code: it computes the expected outputs);
    ``draw_input(rng, constants)`` gives one argument tuple."""

    name: str
    params: str
    doc: str
    body: str
    ref: Callable[..., Callable[..., Any]]
    ranges: tuple[tuple[int, int], ...]
    draw_input: Callable[[random.Random, list[int]], list[Any]]


def _int(lo: int, hi: int) -> Callable[[random.Random, list[int]], list[Any]]:
    return lambda rng, c: [rng.randint(lo, hi)]


def _near_a(rng: random.Random, c: list[int]) -> list[Any]:
    return [c[0] + rng.randint(-3, 3)]


def _word(rng: random.Random, c: list[int]) -> list[Any]:
    return ["".join(rng.choice(_WORD) for _ in range(rng.randint(c[0] + 2, c[0] + 6)))]


def _short_word(rng: random.Random, c: list[int]) -> list[Any]:
    return ["".join(rng.choice(_WORD) for _ in range(rng.randint(1, 4)))]


def _ints(rng: random.Random, c: list[int]) -> list[Any]:
    return [[rng.randint(0, 20) for _ in range(rng.randint(1, 4))]]


def _pair(rng: random.Random, c: list[int]) -> list[Any]:
    return [rng.randint(0, 20), rng.randint(0, 20)]


C = (2, 99)  # the usual constant range: one or two digits
X = _int(0, 40)  # the usual input: a small whole number
S = (2, 19)  # a factor that keeps results short
TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("scale", "x", "Return x times {a}.", "x * {a}", lambda a: lambda x: x * a, (C,), X),
        Template("shift", "x", "Return x plus {a}.", "x + {a}", lambda a: lambda x: x + a, (C,), X),
        Template("lower", "x", "Return x minus {a}.", "x - {a}", lambda a: lambda x: x - a, (C,), X),
        Template(
            "affine", "x", "Return x times {a} plus {b}.", "x * {a} + {b}",
            lambda a, b: lambda x: x * a + b, ((2, 29), C), _int(0, 20),
        ),
        Template(
            "shift_scale", "x", "Return x plus {a}, times {b}.", "(x + {a}) * {b}",
            lambda a, b: lambda x: (x + a) * b, (C, (2, 9)), X,
        ),
        Template(
            "pair", "x, y", "Return x times {a} plus y times {b}.", "x * {a} + y * {b}",
            lambda a, b: lambda x, y: x * a + y * b, (S, S), _pair,
        ),
        Template(
            "above", "x", "Return True if x is greater than {a}.", "x > {a}",
            lambda a: lambda x: x > a, (C,), _near_a,
        ),
        Template(
            "smaller", "x", "Return the smaller of x and {a}.", "min(x, {a})",
            lambda a: lambda x: min(x, a), (C,), _near_a,
        ),
        Template(
            "modulo", "x", "Return x modulo {a}.", "x % {a}",
            lambda a: lambda x: x % a, ((2, 30),), _int(0, 200),
        ),
        Template(
            "add_each", "xs", "Return xs with {a} added to each item.", "[v + {a} for v in xs]",
            lambda a: lambda xs: [v + a for v in xs], (C,), _ints,
        ),
        Template(
            "repeat", "s", "Return s repeated {a} times.", "s * {a}",
            lambda a: lambda s: s * a, ((2, 4),), _short_word,
        ),
        Template(
            "head", "s", "Return the first {a} letters of s.", "s[:{a}]",
            lambda a: lambda s: s[:a], ((1, 6),), _word,
        ),
    )
}  # fmt: skip


def _fill(text: str, constants: list[int]) -> str:
    return text.format(**dict(zip("ab", constants, strict=False)))


def make_task(tpl: Template, constants: list[int], inputs: list[list[Any]], key: str) -> dict[str, Any]:
    """A task from its template, constants and inputs (the first one is the visible example)."""
    fn = tpl.ref(*constants)
    call = f"{tpl.name}({', '.join(repr(a) for a in inputs[0])})"
    prompt = (
        f"def {tpl.name}({tpl.params}):\n"
        f'    """{_fill(tpl.doc, constants)}\n'
        f"    >>> {call}\n"
        f"    {fn(*inputs[0])!r}\n"
        f'    """\n'
    )
    return {
        "prompt": prompt,
        "answer": f"    return {_fill(tpl.body, constants)}",
        "key": key,
        "op": tpl.name,
        "entry": tpl.name,
        "constants": list(constants),
        "inputs": [list(a) for a in inputs[1:]],
        "expected": [fn(*a) for a in inputs[1:]],
    }


def flawed_answer(task: dict[str, Any]) -> str:
    """The flawed teacher's answer: the right body with the first constant plus one."""
    tpl = TEMPLATES[task["op"]]
    return f"    return {_fill(tpl.body, [task['constants'][0] + 1, *task['constants'][1:]])}"


def draw_task(rng: random.Random, names: list[str], hidden_tests: int, max_constant: int) -> dict[str, Any]:
    """One task: a template from ``names``, its constants (at most ``max_constant``), a visible example
    and ``hidden_tests`` other inputs (distinct where the input space allows)."""
    tpl = TEMPLATES[rng.choice(names)]
    constants = [rng.randint(lo, max(lo, min(hi, max_constant))) for lo, hi in tpl.ranges]
    inputs: list[list[Any]] = []
    for _ in range(hidden_tests * 20):
        if len(inputs) == hidden_tests + 1:
            break
        x = tpl.draw_input(rng, constants)
        if x not in inputs:
            inputs.append(x)
    while len(inputs) < hidden_tests + 1:  # a tiny input space: repeat hidden inputs, never the visible one
        inputs.append(inputs[1 + (len(inputs) - 1) % max(1, len(inputs) - 1)])
    right, wrong = tpl.ref(*constants), tpl.ref(constants[0] + 1, *constants[1:])
    for _ in range(200):  # the flawed teacher's answer must fail at least one hidden test
        if any(right(*x) != wrong(*x) for x in inputs[1:]):
            break
        if right(*inputs[0]) != wrong(*inputs[0]):  # only the visible example tells them apart: hide it
            inputs[0], inputs[-1] = inputs[-1], inputs[0]
            continue
        x = tpl.draw_input(rng, constants)
        if x not in inputs:
            inputs[-1] = x
    return make_task(tpl, constants, inputs, f"{tpl.name}:{','.join(map(str, constants))}")


def make_tasks(
    split: str, task_cfg: Any, seed: int, names: list[str], hidden_tests: int, max_constant: int
) -> list[dict[str, Any]]:
    """Distinct functions of one split (``envs.base.draw_tasks``: disjoint, deterministic in the seed)."""
    unknown = sorted(set(names) - set(TEMPLATES))
    if unknown:
        raise ValueError(f"unknown code templates {unknown}; known: {', '.join(TEMPLATES)}")
    return draw_tasks(
        "code",
        split,
        task_cfg,
        seed,
        lambda rng: draw_task(rng, sorted(set(names)), hidden_tests, max_constant),
    )
