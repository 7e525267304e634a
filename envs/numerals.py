r"""Numbers as the ``numeric`` verifier reads them (``envs/commitment.py``): a gold answer is exactly one
number, and an answer's piece states a number, not an expression that holds one.

A number: integer or decimal, thousands grouped by commas (``1,234``; ``1,2`` is two numbers), or a fraction
of integers (``3/4``, ``\frac{3}{4}``); a sign directly or space-separated before it is its sign (``- 3`` is
-3). In an answer, a number next to an operator (``+ - * / ^ !``, ``×``, ``√``, ``\sqrt``, ``\cdot``,
``\pi``, ...) or inside brackets (``-(-3)``, ``\sqrt{144}``) is part of an expression. A gold answer is one
number with nothing but currency before it (``$``) and units after it (``12 m^2``, ``45%``, ``30^\circ``,
``18 apples``; not a scale such as ``million``); anything else (``2\sqrt{3}``, ``x = 5``) is no gold number.
"""

from __future__ import annotations

import re
from fractions import Fraction

# what a number may be written with besides ASCII: the minus sign, full-width forms; zero-width characters
# are dropped (a "3\u200b4" shows as 34 and is read so, not as 3 then 4)
MINUS = str.maketrans(
    {"\u2212": "-", "\ufe63": "-", "\uff0d": "-"}
    | {chr(0xFF10 + d): str(d) for d in range(10)}
    | dict.fromkeys(["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"], None)
)
_DIGITS = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
NUMERAL = re.compile(
    r"(?P<sign>[-+]\s*)?(?:\\[dt]?frac\s*\{\s*(?P<fn>\d+)\s*\}\s*\{\s*(?P<fd>\d+)\s*\}"
    rf"|(?P<num>{_DIGITS})(?:/(?P<den>\d+))?)"
)
# what an answer is written in around its number, not part of it: math delimiters, emphasis, currency, degrees
_DRESS = re.compile(
    r"\\[()\[\]]|\\?\$|\*\*|__|`|\\(?:left|right|displaystyle)\b|\^\s*\{?\s*\\circ\s*\}?|°|\\!"
)
_WRAP = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname|boldsymbol)\s*\{([^{}]*)\}")
_OP_COMMAND = (
    r"\\(?:sqrt|[dt]?frac|cdot|times|div|ast|pi|log|ln|lg|exp|a?(?:sin|cos|tan|cot|sec|csc)h?|arc[a-z]+"
    r"|binom|choose|[lr]floor|[lr]ceil|floor|ceil|b?mod|pmod|sum|prod|int|lim|max|min|gcd|lcm|det|infty"
    r"|c?dots|ldots|overline|bar|vec|hat|tilde)(?![A-Za-z])"
)
# an operator or an opening bracket before the number (its own sign is part of it), or after it one with an
# operand (a dash before prose is no minus: "12 - I checked"), a command, or an adjacent bracket
_OP_BEFORE = re.compile(rf"(?:{_OP_COMMAND}|[-+*/^×·÷√∛π(\[{{])\s*$")
_OPERAND = r"\s*(?:[\d.(\[{\\√π]|[A-Za-z](?![A-Za-z\s]))"
_OP_AFTER = re.compile(rf"\s*(?:[-+*/^×·÷]{_OPERAND}|[√π]|{_OP_COMMAND})|[(\[{{]|!(?={_OPERAND})")
_OUTER = re.compile(r"\s*[({]\s*([^(){}\[\]]*?)\s*[)}]\s*")  # "(12)", "{12}": the number itself
# words after a number that scale or combine it (not units): "12 million", "12 k", "12 or 13", "2 x"
_NOT_UNITS = {"or", "and", "to", "plus", "minus", "times", "over", "by", "divided", "not", "nor", "either"}
_NOT_UNITS |= {"thousand", "million", "billion", "trillion", "hundred", "dozen", "lakh", "crore", "bn", "mn"}
_NOT_UNITS |= {"x", "y", "z", "n", "i", "e", "k", "b"}
_SCALE_LETTERS = {"K", "M", "B"}
_UNIT = re.compile(r"[A-Za-z]+\.?(?:\^\{?[23]\}?)?")


def _value(m: re.Match[str]) -> Fraction | None:
    """The exact value of a ``NUMERAL`` match; None for a zero denominator."""
    if m["fn"] is not None:
        num, den = Fraction(m["fn"]), Fraction(m["fd"])
    else:
        num, den = Fraction(m["num"].replace(",", "")), Fraction(m["den"] or 1)
    if not den:
        return None
    sign = -1 if (m["sign"] or "").startswith("-") else 1
    return sign * num / den


def dressed(text: str) -> str:
    """``text`` without what surrounds a number but is not part of it (``$``, ``**``, ``\\text{}``...)."""
    text = _DRESS.sub(" ", _WRAP.sub(r" \1 ", text))
    return m[1] if (m := _OUTER.fullmatch(text)) else text


def stated(text: str, box: bool = False) -> tuple[list[Fraction], str | None]:
    r"""(the exact numbers ``text`` states, in order; the first expression one is part of, or None). In a box
    (``box``) a ``!`` after a number is always its factorial; in prose only before an operand.

    >>> stated("so x = 1,234 or 3/4 of it"), stated(r"\boxed{- 3}".removeprefix(r"\boxed"))
    (([Fraction(1234, 1), Fraction(3, 4)], None), ([Fraction(-3, 1)], None))
    >>> stated("-(-3)")[1], stated(r"\sqrt{144}")[1], stated("**Answer:** 12 apples")
    ('-(-3)', '\\sqrt{144}', ([Fraction(12, 1)], None))
    """
    text = dressed(text)
    out = []
    for m in NUMERAL.finditer(text):
        before, after = text[: m.start()], text[m.end() :]
        if _OP_BEFORE.search(before) or _OP_AFTER.match(after) or (box and after.startswith("!")):
            return out, text.strip()
        if (v := _value(m)) is not None:
            out.append(v)
    return out, None


def same_number(a: Fraction, b: Fraction) -> bool:
    """Whether two stated numbers are the same answer: exactly equal (``1000001`` is not ``1000000``,
    ``1000.0009`` not ``1000``), except that a number with no finite decimal (``1/3``) is also met by a
    decimal within a relative 1e-6 of it (``0.333333``). Exact: numbers of any length compare, no overflow.

    >>> same_number(Fraction(1, 3), Fraction("0.333333")), same_number(Fraction(10**6), Fraction(10**6 + 1))
    (True, False)
    """
    if a == b:
        return True
    if _terminates(a) and _terminates(b):
        return False
    return abs(a - b) <= Fraction(1, 10**6) * max(abs(a), abs(b))


def _terminates(x: Fraction) -> bool:
    """Whether ``x`` has a finite decimal expansion (its denominator has no prime factor but 2 and 5)."""
    den = x.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


def gold_number(gold: str) -> Fraction | None:
    r"""The one number a gold answer is (units and currency allowed; of GSM8K's solution and ``#### 72``, the
    number after the last ``####``), or None when it is not one.

    >>> gold_number("1,234"), gold_number(r"$-\frac{3}{4}$"), gold_number("12 m^2"), gold_number("45%")
    (Fraction(1234, 1), Fraction(-3, 4), Fraction(12, 1), Fraction(45, 1))
    >>> gold_number("Natalia sold 48/2 = 24 clips in May.\nSo 48+24 = 72 in all.\n#### 72")
    Fraction(72, 1)
    >>> gold_number(r"2\sqrt{3}"), gold_number("12 million"), gold_number("x = 5"), gold_number("1,2")
    (None, None, None, None)
    """
    gold = gold.rsplit("####", 1)[-1]  # GSM8K's answer field: the worked solution, then "#### 72"
    text = dressed(gold.translate(MINUS)).strip().rstrip(".")
    text = m[1] if (m := re.fullmatch(r"\\boxed\s*\{(.*)\}", text)) else text
    text = re.sub(r"^(?:€|£|¥)\s*", "", text)
    m = NUMERAL.match(text)
    if m is None:
        return None
    rest = re.sub(r"\\?%|\\,|\s*/\s*|\\cdot", " ", text[m.end() :]).split()
    for word in rest:
        if not _UNIT.fullmatch(word) or word.lower().rstrip(".") in _NOT_UNITS or word in _SCALE_LETTERS:
            return None
    return _value(m)
