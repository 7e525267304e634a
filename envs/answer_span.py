r"""Where an answer is in a completion's text, and its pieces: rules 1 and 2 of ``envs/commitment.py``, which
scores what they find. The answer's span is every ``\boxed{}`` (``\fbox``, ``\framebox``, a brace-less
``\boxed 4``), else every ``<answer>...</answer>``, else the sentence after the last answer cue, else the
whole text; a span is cut into candidate pieces at list separators, at disjunctions and hedging words (inside
brackets too), and at what lists or ranges two numbers (``|``, ``~``, dashes, ``...``, ``\mid``, ``\\``).

    spans, boxes = answer_spans(r"so \boxed{12}")      # (['12'], True)
    pieces("12 or 13")                                 # ['12', '13']
"""

from __future__ import annotations

import re

MAX_VERIFIED_CHARS = 4000  # what the verifier reads of an answer (math-verify's sympy is not linear)
MAX_PIECES = 16  # more candidates than this is a list, whatever they hold

_BOX = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")
_BARE_BOX = re.compile(r"\\(?:boxed|fbox|framebox)(?:\s+|(?=\d))([^\s{}$]+)")  # "\boxed 4": a box too
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)  # <answer>12</answer>, as R1's format
_CUE = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)|####")
# where the sentence of a cued answer ends: a full stop, "!" or "?" before a word, or a blank line
# ("12. Check: 5+8=13" commits to 12; "approx. 12", "No. 5" and "3.5" go on)
SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Za-z])|\n\s*\n")
_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_MATH = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)
# between two numbers, what lists or ranges them rather than combining them ("3 | 4", "3 - 4" is an
# expression, "3 – 4", "3 ~ 4", "3...4", "3 \\ 4" are not)
_GAP = r"(?:\s|\\[,;:!])*"  # spaces, and latex's thin and medium ones
_BETWEEN = (
    rf"(?<=\d){_GAP}(?:[|~–—]|\.{{2,}}|…|\\(?:mid|wedge|land|[lc]?dots|\\)(?![A-Za-z])){_GAP}(?=[-+]?\.?\d)"
)
# inside one box (read whole by math-verify): two numbers listed, ranged or joined by a disjunction
IN_BOX = re.compile(
    rf"{_BETWEEN}|(?<=\d){_GAP[:-1]}+(?=\d)|\\(?:text|operatorname|mathrm)\s*\{{[^{{}}]*\bor\b"
)
SEPARATOR = re.compile(rf",\s+|;|\n|\\q?quad\b|\b(?:and|to)\b|(?<=\d)\s+(?=[-+]?\.?\d)|{_BETWEEN}", re.I)
# cut inside brackets too: disjunctions and hedging words, in a few languages; a question aside "(4?)"
_DISJUNCTION = re.compile(
    r"\\lor\b|\\vee\b|∨|或|\b(?:or|either|maybe|perhaps|possibly|alternatively|otherwise|else|vs|versus"
    r"|through|oder|ou|или)\b|\\(?:operatorname|text|mathrm)\s*\{\s*or\s*\}|\((?=\s*[-+]?\d[^()]*\?\s*\))",
    re.I,
)
# an alternative that is bounded ("3 or about 4") still offers a second value
_BOUNDED_ALTERNATIVE = re.compile(
    r"\b(?:or|either)\s+(?:approximately|roughly|about|around|nearly|almost|at\s+(?:least|most)"
    r"|(?:more|less|greater|fewer)\s+than)\b",
    re.I,
)
# what a text is written with that is not its value: invisible boxes, arrows, an escaped dollar, a thin
# space grouping thousands (1\,234)
INVISIBLE = re.compile(r"\\[hv]?phantom\s*\{[^{}]*\}|-+>|=+>|→|⟹|\\(?:to|Rightarrow|implies)\b|\\\$")
THIN_GROUP = re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))")


def boxed(text: str) -> list[str]:
    r"""The contents of every ``\boxed{...}`` / ``\fbox{...}`` / brace-less ``\boxed 4`` in ``text`` (braces
    balanced), in order.

    >>> boxed(r"so \boxed{\frac{1}{2}} or \fbox{3}, \boxed 4")
    ['\\frac{1}{2}', '3', '4']
    """
    return [content for content, _ in _boxes(text)]


def _boxes(text: str) -> list[tuple[str, int]]:
    """(contents, where the box ends) of every box in ``text``, in order."""
    out = [(m[1], m.end()) for m in _BARE_BOX.finditer(text)]
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((text[m.end() : i - 1], i))
    return sorted(out, key=lambda box: box[1])


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
    if tags := _ANSWER_TAG.findall(region):
        return tags, False
    cues = list(_CUE.finditer(region))
    if not cues:
        return [region], False
    span = region[cues[-1].end() :]
    end = SENTENCE_END.search(span)  # the answer's sentence: what follows (a check, a remark) is not it
    return [span[: end.start()] if end else span], False


def pieces(span: str, separator: re.Pattern[str] | None = SEPARATOR) -> list[str]:
    r"""``span`` split into candidate pieces (rule 2): each math segment (``$..$``, ``\(..\)``, ``\[..\]``)
    whole, the text between them split at ``separator`` outside brackets (``\text{..}`` unwrapped there);
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


def offered_beside(region: str, spans: list[str], boxes: bool) -> str | None:
    """A second value offered beside the answer: a bounded alternative in its span ("3 or about 4"), or, after
    the last box, a disjunction and a number in the box's sentence ("\\boxed{3}, or maybe 4")."""
    if m := next((m for s in spans if (m := _BOUNDED_ALTERNATIVE.search(s))), None):
        return m.group(0)
    if boxes:
        region = region[-MAX_VERIFIED_CHARS:]  # as answer_spans read it
        after = region[_boxes(region)[-1][1] :]
        after = after[: m.start()] if (m := SENTENCE_END.search(after)) else after
        if (m := _DISJUNCTION.search(after)) and re.search(r"\d", after[m.end() :]):
            return m.group(0)
    return None


def tidy(region: str) -> str:
    """``region`` without what is written but not read: invisible boxes (``\\phantom``), arrows, an escaped
    dollar; a thin space grouping thousands (``1\\,234``) closed up."""
    return THIN_GROUP.sub("", INVISIBLE.sub(" ", region))
