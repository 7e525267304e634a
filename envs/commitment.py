"""What an answer commits to: the one value the ``math`` and ``numeric`` verifiers score, or a hedge that
scores 0 (``envs/dataset_verify.py`` calls these; ``docs/guide/datasets.md`` has the rule with examples).

A policy under RL finds every way a verifier pays for more than one guess: "12 or 13", ``\\boxed{12}
\\boxed{13}``, ``\\{12, 13\\}``, ``[11, 13]``, ``12 \\pm 1``, "13, 12" (math-verify alone reads the last
number of the last two and pays when it is the gold one). The rule here:

1. **The answer's span.** The text after the reasoning block (``final_answer``). In it, the ``\\boxed{}`` (or
   ``\\fbox{}``) contents when there are any — every box, and they must agree; else every ``<answer>`` tag's;
   else the text after the last answer cue (``answer is``, ``answer:``, ``final answer``, GSM8K's ``####``)
   to the end of its sentence (a full stop, ``!`` or ``?`` before a word, or a blank line: "The answer is 12.
   Check: 5+8=13." is 12); else all of it. An alternative offered beside it ("12 or about 13", "\\boxed{12},
   or maybe 13") is a hedge.
2. **Its pieces** (``envs/answer_span.py``). The span is split, outside brackets, at list and disjunction
   separators: ``,`` + space, ``;``, line breaks, the words *or*, *and*, *either*, *to*, hedging words
   (*maybe*, *perhaps*, *vs*, ...), ``\\lor``, ``\\vee``, ``∨``, ``\\quad``, and between two bare numbers the
   space or what lists or ranges them (``|``, ``~``, dashes, ``...``, ``\\mid``). Each piece that holds a
   value (math-verify's parse; for ``numeric``, its numbers after the last ``=``, each a number and not part
   of an expression: ``\\sqrt{144}`` or ``-(-3)`` is not well formed, ``- 3`` is -3; ``envs/numerals.py``)
   is a candidate; prose pieces hold none.
3. **One value.** Against a gold answer that is one value, the candidates must all be the same value and that
   value must itself be one value: a set or list of several, an interval, a union, an inequality, ``\\pm`` /
   ``\\mp`` (anywhere in the span), or a piece listing several numbers is a hedge. A hedge scores 0 and is
   not well formed (its ``hedge`` says why). A gold answer that is itself a set, interval, tuple or list keeps
   matching its own form (math-verify compares the structures); only disagreeing boxes or pieces joined by a
   disjunction word hedge it.

4. **No negated or bounded value.** A piece that negates or bounds its number ("not 42", "at least 42",
   ``\\neq``, ``\\geq``, ``\\approx``) commits to none: "42, not 43" pays 42, "the answer is not 42" nothing.
5. **Bounded work.** The minus sign (U+2212) and full-width digits read as ASCII; commas group thousands
   only (``1,2`` is two numbers). Exponent towers and huge powers or factorials of numbers are no answer
   (math-verify would compute them), and one answer's parses and comparisons share one budget
   (``BUDGET_S``): over it, the answer scores 0, not well formed.

The honest forms stay paid: ``\\boxed{12}``, ``$12$``, ``x = 12``, "The answer is 12.", "3 x 4 = 12", each
after a think block or not. An answer with several values and nothing marking which one is meant (no box, no
cue) is not an answer to one: mark it.
"""

from __future__ import annotations

import contextvars
import math
import re
import threading
import time
from fractions import Fraction
from typing import Any, NamedTuple

from envs.answer_span import IN_BOX, MAX_PIECES, SEPARATOR, answer_spans, offered_beside, pieces, tidy
from envs.numerals import MINUS as _MINUS
from envs.numerals import gold_number, same_number, stated

# marks of several values however they are parsed (math-verify reads "13 \lor 12" as 12)
_HEDGE_MARK = re.compile(r"\\pm\b|\\mp\b|±|∓|\\lor\b|\\vee\b|∨|\\cup\b|∪")
# a piece that negates or bounds its number commits to no value: "not 42", "at least 42", "\neq 42"
_NEGATION = re.compile(
    r"\b(?:not|isn't|cannot|can't|never|except|but\s+not|wrong|incorrect|neither|nor"
    r"|at\s+(?:least|most)|(?:more|less|greater|fewer)\s+than|approximately|roughly|about|around)\b"
    r"|\\(?:neq?|neg|approx|sim|simeq|geq?|leq?|gtrsim|lesssim|cancel|sout|not)\b|[≠¬≈≥≤<>]",
    re.I,
)
# exponent towers and huge factorials of numbers: math-verify would compute them (seconds to hours)
_TOWER = re.compile(
    r"\^\s*\{[\s\d.]*\^|\d\s*(?:\^|\*\*)\s*\d+\s*(?:\^|\*\*)\s*\d|(?:\^|\*\*)\s*\{?\s*\d{5,}|\d{4,}\s*!|\d{400,}"
    # a power of 1000 or more of anything but a plain number ((x+1)^{9999} expands), a power whose
    # exponent holds a power ((9^9)^{(9^9)}), a factorial of a bracket with a power or a large number, a
    # binomial of large numbers
    r"|(?<![\d\s])\s*(?:\^|\*\*)\s*\{?\s*\d{4,}|(?:\^|\*\*)\s*(?:\{|\(|\\left\s*\()[^{}]{0,60}?(?:\^|\*\*)"
    r"|[({][^()A-Za-z]*(?:\d{3,}|\^)[^()A-Za-z]*[)}]\s*!|\\[dt]?binom\s*\{[^{}]*\}\s*\{?\s*\d{4,}"
    r"|\\[dt]?binom\s*\{\s*\d{4,}|\d{4,}\s*\\choose"
)
BUDGET_S = 8.0  # math-verify's time for one answer, all its pieces and comparisons together
_ASIDE = re.compile(r"\([^()]*\)")
_WORD = re.compile(r"[A-Za-z]{2,}")
_EMPHASIS = re.compile(r"\*\*|__|`")  # markdown around an answer (**12**, `12`): not part of it
_PROSE_ASIDE = re.compile(r"\([^()]*[A-Za-z]{2,}[^()]*\)")  # "(not 13)", "(or so)": not the answer
_FORMULA = re.compile(r"[\d\\^]")
_DISPLAY = re.compile(r"\s*\\[\[(](.*)\\[\])]\s*", re.S)
_COMMAND = re.compile(r"\\[A-Za-z]+")


class Verdict(NamedTuple):
    """What the verifier found: ``hedge`` says why an answer committed to no single value (None if it did)."""

    correct: bool
    well_formed: bool
    parsed: str
    hedge: str | None = None


# -- math (math-verify) ----------------------------------------------------------------------------------
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("math_verify_deadline", default=math.inf)


class _OutOfTime(Exception):
    """The answer's verification used up ``BUDGET_S``."""


def _limit() -> int | None:
    # math-verify bounds each call with SIGALRM, which only the main thread may set: elsewhere no per-call
    # timeout (the answer read is bounded, towers are refused, the budget is checked between calls).
    left = _DEADLINE.get() - time.monotonic()
    if left <= 0:
        raise _OutOfTime
    if threading.current_thread() is not threading.main_thread():
        return None
    return max(1, min(5, math.ceil(left)))


def _parse(text: str, math: bool = False) -> Any:
    """math-verify's value of ``text``, or None. ``math``: one formula (a box's contents, a gold answer);
    else a piece of text, its asides in words left out, read as a formula when it looks like one (digits,
    latex or ``^``, and no word of two letters or more)."""
    from math_verify import parse

    if m := _DISPLAY.fullmatch(text):  # \[12\] or \(12\): math-verify reads only $-delimited math
        text = f"${m[1]}$"
    if not math and "$" not in text:
        text = _PROSE_ASIDE.sub(" ", _EMPHASIS.sub(" ", text))
    if math or ("$" not in text and _FORMULA.search(text) and not _WORD.search(_COMMAND.sub(" ", text))):
        text = f"${text}$"
    if _TOWER.search(text):  # a number too large to compute is no answer
        return None
    got = parse(text, parsing_timeout=_limit())
    return got[0] if got else None


def _same(a: Any, b: Any) -> bool:
    from math_verify import verify

    return bool(verify([a], [b], timeout_seconds=_limit()))


def single(value: Any) -> bool:
    """Whether a parsed value is one value: not a set or list of several, an interval, a union, a logical
    combination or an inequality (``x = v`` is ``v``).

    >>> import sympy
    >>> single(sympy.Integer(12)), single(sympy.FiniteSet(12)), single(sympy.FiniteSet(12, 13))
    (True, True, False)
    >>> single(sympy.Interval(11, 13)), single(sympy.Eq(sympy.Symbol("x"), 12))
    (False, True)
    """
    from sympy import Eq, FiniteSet, Set, Symbol, Tuple
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import Boolean

    if isinstance(value, Symbol):  # a word or a name ("True", "Yes", x): one value (sympy calls it Boolean)
        return True
    if isinstance(value, FiniteSet):
        return len(value) == 1 and single(next(iter(value)))
    if isinstance(value, Set | Tuple | list | tuple):
        return False
    if isinstance(value, Relational):
        return isinstance(value, Eq) and single(value.rhs)
    return not isinstance(value, Boolean) or value in (True, False)


def _distinct(values: list[Any], same: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(same(v, u) for u in out):
            out.append(v)
    return out


def _candidates(
    gold_is_one: bool, region: str, value: Any, split_boxes: bool = False
) -> tuple[list[Any], str | None]:
    """The values ``region`` offers (``value`` reads one piece, given whether it is a box's: a box is one
    formula unless ``split_boxes``) or the hedge that disqualifies it: a several-values mark, a list too long
    to be an answer, what ``value`` says (a text)."""
    region = tidy(region)
    spans, boxes = answer_spans(region)
    if gold_is_one and (mark := next((m for s in spans if (m := _HEDGE_MARK.search(s))), None)):
        return [], f"a several-values mark ({mark.group(0)})"
    if gold_is_one and (alt := offered_beside(region, spans, boxes)):
        return [], f"an alternative offered ({alt})"
    found: list[Any] = []
    for span in spans:
        parts = [span] if boxes and not split_boxes else pieces(span, SEPARATOR if gold_is_one else None)
        if len(parts) > MAX_PIECES:
            return [], f"a list of {len(parts)} pieces"
        for p in parts:
            got = value(p, boxes)
            if isinstance(got, str):
                return [], got
            found += got
    return found, None


def _committed(
    gold_is_one: bool,
    region: str,
    value: Any,
    same: Any,
    what: str,
    split_boxes: bool = False,
    show: Any = str,
) -> Any:
    """The one value ``region`` commits to, or the ``Verdict`` that it committed to none: no value (not well
    formed) or a hedge (several ``what``, or ``_candidates``' reason)."""
    found, hedge = _candidates(gold_is_one, region, value, split_boxes)
    values = [] if hedge else _distinct(found, same)
    if len(values) > 1:
        hedge = f"several {what}: " + ", ".join(show(v) for v in values[:4])
    if hedge or not values:
        return Verdict(False, False, "", hedge)
    return values[0]


def math_verdict(gold: str, region: str) -> Verdict:
    r"""Score ``region`` (the text after the reasoning) against ``gold`` with math-verify, paying only what it
    commits to (the module docstring's rule).

    >>> math_verdict("12", r"so \boxed{12}").correct, math_verdict("12", "13 or 12").hedge
    (True, 'several candidates: 13, 12')
    """
    token = _DEADLINE.set(time.monotonic() + BUDGET_S)
    try:
        return _math_verdict(gold.translate(_MINUS), region.translate(_MINUS))
    except _OutOfTime:
        return Verdict(False, False, "", f"verifying the answer took over {BUDGET_S:g} s")
    finally:
        _DEADLINE.reset(token)


def _math_verdict(gold: str, region: str) -> Verdict:
    gold_value = _parse(gold) if "$" in gold or "\\boxed" in gold else _parse(gold.strip(), math=True)
    one = gold_value is None or single(gold_value)

    def value(piece: str, box: bool) -> list[Any] | str:
        formula = box or piece.startswith(("$", "\\[", "\\("))  # read whole, as one formula
        if one and formula and "\\begin" not in piece and (m := IN_BOX.search(piece)):
            return f"several values in one box ({m.group(0).strip() or 'a space'})"
        if one and _NEGATION.search(_PROSE_ASIDE.sub(" ", piece)):  # "not 42", "\\geq 42": none committed to
            return []
        v = _parse(piece, math=box)
        return [] if v is None else [v]

    got = _committed(one, region, value, _same, "candidates")
    if isinstance(got, Verdict):
        return got
    if one and not single(got):
        return Verdict(False, False, str(got), f"not one value: {got}")
    return Verdict(gold_value is not None and _same(gold_value, got), True, str(got))


# -- numeric ------------------------------------------------------------------------------------------
def _shown(x: Fraction) -> str:
    """A stated number as the verdict shows it: its decimal where a float holds it, else its first digits."""
    try:
        return repr(float(x))
    except OverflowError:
        return f"{str(x)[:24]}... ({len(str(x.numerator))} digits)"


def _piece_number(piece: str, box: bool = False) -> list[Fraction] | str:
    """The numbers a piece states as its value (``envs.numerals.stated``): after its last ``=``,
    parenthesised asides left out when something else holds a number; an expression is none (a text: why)."""
    value = piece.rsplit("=", 1)[-1]
    for text in (_ASIDE.sub(" ", value), value):
        got, expression = stated(text, box)
        if expression is not None:
            return f"an expression, not a number: {expression[:40]}"
        if got:
            return _distinct(got, same_number)
    return []


def numeric_verdict(gold: str, region: str) -> Verdict:
    """Score ``region`` against the number ``gold``, paying only one number (the module docstring's rule).
    ``gold`` must be one number (``envs.numerals.gold_number``; the dataset refuses other rows at load).

    >>> numeric_verdict("12", "3 x 4 = 12").correct, numeric_verdict("14", "12 13 14").hedge
    (True, 'several numbers: 12.0, 13.0, 14.0')
    """
    want = gold_number(gold)
    if want is None:
        raise ValueError(f"the numeric verifier's gold answer {gold!r} is not one number")
    region = region.translate(_MINUS)

    def value(piece: str, box: bool) -> list[Fraction] | str:
        if _NEGATION.search(_PROSE_ASIDE.sub(" ", piece)):  # "not 42", "at least 42": none committed to
            return []
        got = _piece_number(piece, box)
        if isinstance(got, str) or len(got) <= 1:
            return got
        return "several numbers: " + ", ".join(map(_shown, got[:4]))

    got = _committed(True, region, value, same_number, "numbers", split_boxes=True, show=_shown)
    if isinstance(got, Verdict):
        return got
    return Verdict(same_number(got, want), True, _shown(got))
