"""What an answer commits to: the one value the ``math`` and ``numeric`` verifiers score, or a hedge that
scores 0 (``envs/dataset_verify.py`` calls these; ``docs/guide/datasets.md`` has the rule with examples).

A policy under RL finds every way a verifier pays for more than one guess: "12 or 13", ``\\boxed{12}
\\boxed{13}``, ``\\{12, 13\\}``, ``[11, 13]``, ``12 \\pm 1``, "13, 12" (math-verify alone reads the last
number of the last two and pays when it is the gold one). The rule here:

1. **The answer's span.** The text after the reasoning block (``final_answer``). In it, the ``\\boxed{}`` (or
   ``\\fbox{}``) contents when there are any — every box, and they must agree; else the text after the last
   answer cue (``answer is``, ``answer:``, ``final answer``, GSM8K's ``####``) to the end of its sentence (a
   full stop, ``!`` or ``?`` before a word, or a blank line: "The answer is 12. Check: 5+8=13." is 12); else
   all of it.
2. **Its pieces.** The span is split, outside brackets, at list and disjunction separators: ``,`` + space,
   ``;``, line breaks, the words *or*, *and*, *either*, *to*, ``\\lor``, ``\\vee``, ``∨``, ``\\quad``, and the
   space between two bare numbers. Each piece that holds a value (math-verify's parse; for ``numeric``, its
   numbers after the last ``=``, each a number and not part of an expression: ``\\sqrt{144}`` or ``-(-3)``
   is not well formed, ``- 3`` is -3; ``envs/numerals.py``) is a candidate; prose pieces hold none.
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
from typing import Any, NamedTuple

from envs.numerals import MINUS as _MINUS
from envs.numerals import gold_number, stated

MAX_VERIFIED_CHARS = 4000  # what the verifier reads of an answer (math-verify's sympy is not linear)
MAX_PIECES = 16  # more candidates than this is a list, whatever they hold

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CUE = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)|####")
# where the sentence of a cued answer ends: a full stop, "!" or "?" before a word, or a blank line
# ("12. Check: 5+8=13" commits to 12; "approx. 12", "No. 5" and "3.5" go on)
_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Za-z])|\n\s*\n")
_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_MATH = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)
# marks of several values however they are parsed (math-verify reads "13 \lor 12" as 12)
_HEDGE_MARK = re.compile(r"\\pm\b|\\mp\b|±|∓|\\lor\b|\\vee\b|∨|\\cup\b|∪")
_SEPARATOR = re.compile(r",\s+|;|\n|\\q?quad\b|\b(?:and|to)\b|(?<=\d)\s+(?=[-+]?\.?\d)", re.I)
_DISJUNCTION = re.compile(r"\\lor\b|\\vee\b|∨|\b(?:or|either)\b", re.I)  # cut inside brackets too
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
)
BUDGET_S = 8.0  # math-verify's time for one answer, all its pieces and comparisons together
_ASIDE = re.compile(r"\([^()]*\)")
_WORD = re.compile(r"[A-Za-z]{2,}")
_EMPHASIS = re.compile(r"\*\*|__|`")  # markdown around an answer (**12**, `12`): not part of it
_PROSE_ASIDE = re.compile(r"\([^()]*[A-Za-z]{2,}[^()]*\)")  # "(not 13)", "(or so)": not the answer
_FORMULA = re.compile(r"[\d\\^]")
_COMMAND = re.compile(r"\\[A-Za-z]+")


class Verdict(NamedTuple):
    """What the verifier found: ``hedge`` says why an answer committed to no single value (None if it did)."""

    correct: bool
    well_formed: bool
    parsed: str
    hedge: str | None = None


def boxed(text: str) -> list[str]:
    r"""The contents of every ``\boxed{...}`` / ``\fbox{...}`` in ``text`` (braces balanced), in order.

    >>> boxed(r"so \boxed{\frac{1}{2}} or \fbox{3}")
    ['\\frac{1}{2}', '3']
    """
    out = []
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def answer_spans(region: str) -> tuple[list[str], bool]:
    """The texts the answer commits in (rule 1) and whether they are boxes: every box's contents, else what
    follows the last cue, else the whole region.

    >>> answer_spans("3 x 4 = 12, so the answer is 12."), answer_spans(r"\\boxed{12}")
    ((['12.'], False), (['12'], True))
    >>> answer_spans("The answer is 12. Check: 5+8=13."), answer_spans("The answer is approx. 12.5 m.")
    ((['12'], False), (['approx. 12.5 m.'], False))
    """
    region = region[-MAX_VERIFIED_CHARS:]
    boxes = boxed(region)
    if boxes:
        return boxes, True
    cues = list(_CUE.finditer(region))
    if not cues:
        return [region], False
    span = region[cues[-1].end() :]
    end = _SENTENCE_END.search(span)  # the answer's sentence: what follows (a check, a remark) is not it
    return [span[: end.start()] if end else span], False


def pieces(span: str, separator: re.Pattern[str] | None = _SEPARATOR) -> list[str]:
    r"""``span`` split into candidate pieces (rule 2): each math segment (``$..$``, ``\(..\)``, ``\[..\]``)
    whole, the text between them split at ``separator`` outside brackets (``	ext{..}`` unwrapped there);
    empty pieces left out.

    >>> pieces(r"$x = 12$ or $x = 13$"), pieces("{12, 13}, [1, 2]"), pieces("12 13")
    (['$x = 12$', '$x = 13$'], ['{12, 13}', '[1, 2]'], ['12', '13'])
    """
    out, at = [], 0
    for m in _MATH.finditer(span):
        out += _split(_TEXT.sub(r" \1 ", span[at : m.start()]), separator)
        out.append(m.group(0))
        at = m.end()
    out += _split(_TEXT.sub(r" \1 ", span[at:]), separator)
    # a piece ending in "=" is the left side of the next one's value
    return [p for p in (q.strip(" .:\t") for q in out) if p and not p.endswith("=")]


def _split(text: str, separator: re.Pattern[str] | None) -> list[str]:
    """``text`` cut at the disjunction words anywhere and at ``separator`` outside brackets."""
    anywhere = {m.start(): m.end() for m in _DISJUNCTION.finditer(text)}
    cuts = {**({m.start(): m.end() for m in separator.finditer(text)} if separator else {}), **anywhere}
    out, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if i in cuts and (depth == 0 or i in anywhere):
            out.append(text[start:i])
            start = i = cuts[i]
            continue
        depth = max(0, depth + {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(text[i], 0))
        i += 1
    return [*out, text[start:]]


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
    spans, boxes = answer_spans(region)
    if gold_is_one and (mark := next((m for s in spans if (m := _HEDGE_MARK.search(s))), None)):
        return [], f"a several-values mark ({mark.group(0)})"
    found: list[Any] = []
    for span in spans:
        parts = [span] if boxes and not split_boxes else pieces(span, _SEPARATOR if gold_is_one else None)
        if len(parts) > MAX_PIECES:
            return [], f"a list of {len(parts)} pieces"
        for p in parts:
            got = value(p, boxes)
            if isinstance(got, str):
                return [], got
            found += got
    return found, None


def _committed(
    gold_is_one: bool, region: str, value: Any, same: Any, what: str, split_boxes: bool = False
) -> Any:
    """The one value ``region`` commits to, or the ``Verdict`` that it committed to none: no value (not well
    formed) or a hedge (several ``what``, or ``_candidates``' reason)."""
    found, hedge = _candidates(gold_is_one, region, value, split_boxes)
    values = [] if hedge else _distinct(found, same)
    if len(values) > 1:
        hedge = f"several {what}: " + ", ".join(str(v) for v in values[:4])
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

    def value(piece: str, box: bool) -> list[Any]:
        if one and _NEGATION.search(piece):  # "not 42", "\\geq 42": no value committed to
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
def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _piece_number(piece: str, box: bool = False) -> list[float] | str:
    """The numbers a piece states as its value (``envs.numerals.stated``): after its last ``=``,
    parenthesised asides left out when something else holds a number; an expression is none (a text: why)."""
    value = piece.rsplit("=", 1)[-1]
    for text in (_ASIDE.sub(" ", value), value):
        got, expression = stated(text, box)
        if expression is not None:
            return f"an expression, not a number: {expression[:40]}"
        if got:
            return _distinct(got, _close)
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

    def value(piece: str, box: bool) -> list[float] | str:
        if _NEGATION.search(piece):  # "not 42", "at least 42": no value committed to
            return []
        got = _piece_number(piece, box)
        if isinstance(got, str) or len(got) <= 1:
            return got
        return "several numbers: " + ", ".join(map(str, got[:4]))

    got = _committed(True, region, value, _close, "numbers", split_boxes=True)
    if isinstance(got, Verdict):
        return got
    return Verdict(_close(got, float(want)), True, repr(got))
