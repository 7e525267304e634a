"""Answers never run as code: several reasoning-gym scorers evaluate the answer text (``eval``, sympy's
``parse_expr``), so ``envs.inert.hazard`` must refuse any answer that would do more than arithmetic there, or
compute a value too large, while every honest answer form (numbers, polynomials, antiderivatives, lists,
matrices, prose) still reaches the scorer. Attacked through the real datasets' own scorers."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from envs.inert import hazard
from envs.reasoning_gym import ReasoningGymEnv, ReasoningGymOptions

CODE = [
    "__import__('os').system('touch /tmp/pwned')",
    "open('/etc/passwd').read()",
    "print(1)",
    "x.__class__",
    "getattr(x, 'y')",
    "sympify('x')",
    "parse_expr('x')",
    "(lambda: 1)()",
    "[c for c in 'abc']",
    "f'{1}'",
    "sin(x).subs(x, 1)",
    "globals()['entry']",
    "(y := 1)",
    "_secret",
    "__builtins__",
    "exp(x)(1)",
    "factorial(10)",
    "5!",  # parse_expr's factorial notation
    "__import__('os').system('id')!",  # not Python, but parse_expr's transformation makes it a call
]
HUGE = ["9**9**9**9", "99999**99999", "(2**1000)**1000", "1 << 10**9", "['a'] * 10**9", "(['a']+['b'])*10**9",
        "'ab' * 10**6", "10**10**10", "(10**5000)!"]  # fmt: skip
HONEST = [
    "42",
    "-7",
    "3.14159",
    "1/3",
    "-0x1f",
    "-3*x**3 + 2*x**2 - x + 5",
    "x**(3/2)/3 + exp(-x**2) + C",
    "-cos(2*x)/2 + log(x) + atan(x) + sqrt(x) + C",
    "(x + 1)**3",
    "2**1000",
    "['a', 'b', 'c']",
    "[[1, 0], [0, 1]]",
    "(4 + 8) * 2 - 3",
    "Zoey is a knight, and Oliver is a knave.",
    "The Eiffel Tower (Paris)",
    "U R' F2",
    "True",
    '{"output": [1, 2]}',
    "A=1,B=2",
]


@pytest.mark.parametrize("text", CODE + HUGE)
def test_code_and_huge_values_are_refused(text):
    t0 = time.perf_counter()
    assert hazard(text) is not None
    assert time.perf_counter() - t0 < 5  # it decides without evaluating


@pytest.mark.parametrize("text", HONEST)
def test_honest_answers_reach_the_scorer(text):
    assert hazard(text) is None


def test_a_long_answer_is_not_evaluated():
    assert "characters" in hazard("1+" * 20_000 + "1")


GOLD_FROM_THE_FRAME = {
    "polynomial_multiplication": "__import__('sympy').parse_expr(__import__('sys')._getframe({d})"
    ".f_locals['entry']['answer'])",
    "simple_integration": "__import__('sympy').integrate(__import__('sympy').parse_expr(__import__('sys')"
    "._getframe({d}).f_locals['entry']['metadata']['integrand']), __import__('sympy').Symbol("
    "__import__('sys')._getframe({d}).f_locals['entry']['metadata']['variable']))",
}


@pytest.mark.parametrize("dataset", sorted(GOLD_FROM_THE_FRAME))
def test_an_answer_that_reads_the_gold_from_the_scorer_is_paid_nothing(dataset, tmp_path):
    """The attack that had scored 1.0 on every task (one fixed completion reading the gold answer out of the
    scorer's frame) and one that writes a file: refused before the scorer sees them, and no file appears."""
    env = ReasoningGymEnv(ReasoningGymOptions(dataset=dataset, config={}))
    tasks = env.tasks("heldout", SimpleNamespace(train_size=4, heldout_size=4), 0)
    marker = tmp_path / "pwned"
    for task in tasks:
        env.reset(task, 0)
        for d in range(1, 7):
            out = env.step("<think>no work</think>" + GOLD_FROM_THE_FRAME[dataset].format(d=d)).outcome
            assert (out["correct"], out["score"], out["well_formed"]) == (False, 0.0, False)
            assert out["refused"].startswith("calls")
        out = env.step(f"__import__('pathlib').Path('{marker}').touch()").outcome
        assert out["score"] == 0.0 and not marker.exists()
        assert env.step(task["answer"]).outcome["correct"]  # the honest answer still pays


@pytest.mark.parametrize("dataset", ["string_insertion", "spiral_matrix", "binary_matrix", "n_queens"])
def test_the_eval_scorers_never_run_the_answer(dataset, tmp_path):
    env = ReasoningGymEnv(ReasoningGymOptions(dataset=dataset, config={}))
    task = env.tasks("heldout", SimpleNamespace(train_size=2, heldout_size=2), 0)[0]
    env.reset(task, 0)
    marker = tmp_path / "pwned"
    out = env.step(f"__import__('pathlib').Path('{marker}').write_text('x') or []").outcome
    assert out["score"] == 0.0 and out["refused"] and not marker.exists()
    assert env.step(task["answer"]).outcome["correct"]
