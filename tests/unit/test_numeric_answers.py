r"""The ``numeric`` verifier compares one number with one number (``envs/numerals.py``,
``envs/commitment.py``): a gold answer that is not one number (``\frac{3}{4}`` read as its last number 4,
``12 m^2`` as 2) is refused when the dataset is loaded, naming the row and the field; an answer piece must be
a number, not an expression that holds one (``\sqrt{144}``, ``-(-3)``), and a sign space-separated before its
digits is its sign (``- 3`` is -3)."""

from __future__ import annotations

import json

import pytest

from envs.base import make_env
from envs.commitment import numeric_verdict
from envs.numerals import gold_number


@pytest.mark.parametrize(
    ("gold", "text", "correct"),
    [
        ("\\frac{3}{4}", "\\boxed{4}", False),  # was paid: the gold answer's last number
        ("\\frac{3}{4}", "\\boxed{0.75}", True),
        ("\\frac{3}{4}", "3/4", True),
        ("\\frac{3}{4}", "\\boxed{\\frac{3}{4}}", True),
        ("12 m^2", "2", False),  # was paid
        ("12 m^2", "12", True),
        ("45%", "45", True),
        ("\\boxed{12}", "12", True),
    ],
)
def test_the_gold_answer_is_its_one_number(gold, text, correct):
    assert numeric_verdict(gold, text).correct is correct


@pytest.mark.parametrize(
    ("gold", "text", "correct", "formed"),
    [
        ("144", "\\boxed{\\sqrt{144}}", False, False),
        ("3", "\\boxed{- 3}", False, True),  # the sign before the digits is the number's: -3
        ("-3", "\\boxed{- 3}", True, True),
        ("-3", "\\boxed{-(-3)}", False, False),
        ("12", "$12\\pi$", False, False),
        ("12", "\\boxed{2 \\cdot 6}", False, False),
        ("5", "\\boxed{5!}", False, False),
        ("12", "12 - x", False, False),
        # honest forms stay paid: prose, units, dress, a dash before prose, an exclamation
        ("12", "The answer is 12!", True, True),
        ("12", "The answer is 12 - I checked it.", True, True),
        ("12", "12 (or twelve)", True, True),
        ("12", "\\boxed{12 \\text{ apples}}", True, True),
        ("30", "30^\\circ", True, True),
        ("18", "\\$18", True, True),
        ("12", "x = (12)", True, True),
        ("120", "5! = 5 \\cdot 4 \\cdot 3 \\cdot 2 = 120", True, True),
    ],
)
def test_an_answer_must_be_a_number_not_an_expression(gold, text, correct, formed):
    v = numeric_verdict(gold, text)
    assert (v.correct, v.well_formed) == (correct, formed), v
    if not formed:
        assert v.hedge.startswith("an expression")


@pytest.mark.parametrize(
    "gold", ["2\\sqrt{3}", "12 million", "12k", "x = 5", "1,2", "5 ft 3 in", "12 or 13", "1e5", "3/0"]
)
def test_a_gold_answer_that_is_not_one_number_is_refused(gold):
    assert gold_number(gold) is None
    with pytest.raises(ValueError, match="not one number"):
        numeric_verdict(gold, "12")


def test_the_dataset_refuses_such_a_row_at_load_naming_it(tmp_path):
    rows = [{"q": "a?", "a": "72"}, {"q": "b?", "a": "1,234"}, {"q": "c?", "a": "12 m^2"}]
    rows.append({"q": "d?", "a": 7})
    rows.append({"q": "g?", "a": "Natalia sold 48/2 = 24 clips.\nSo 48+24 = 72 in all.\n#### 72"})  # GSM8K's
    bad = [*rows, {"q": "e?", "a": "2\\sqrt{3}"}]
    for name, data in (("good", rows), ("bad", bad)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (tmp_path / "h.jsonl").write_text(json.dumps({"q": "h?", "a": "1"}) + "\n")
    args = {"heldout": str(tmp_path / "h.jsonl"), "prompt_field": "q", "answer_field": "a"}
    make_env("dataset", {**args, "train": str(tmp_path / "good.jsonl"), "verifier": "numeric"})
    make_env("dataset", {**args, "train": str(tmp_path / "bad.jsonl"), "verifier": "math"})  # math: fine
    with pytest.raises(ValueError, match=r"bad.jsonl: row 5 field 'a' is '2\\\\sqrt\{3\}', not one number"):
        make_env("dataset", {**args, "train": str(tmp_path / "bad.jsonl"), "verifier": "numeric"})


def test_a_gsm8k_answer_field_pays_its_final_number_only():
    """GSM8K's answer field is the worked solution then ``#### 72``: the gold is 72 (its other numbers, 24 and
    48, are not), as the last number was before golds had to be one number."""
    gold = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips in all.\n#### 72"
    assert numeric_verdict(gold, "The answer is 72.").correct
    assert not numeric_verdict(gold, "The answer is 24.").correct


@pytest.mark.parametrize(
    "gold,text,correct",
    [
        ("1000001", "1000000", False),  # a relative 1e-6 paid these before
        ("5000004", "5000000", False),
        ("123456800", "123456789", False),
        ("1000.0009", "1000", False),
        ("1/3", "0.333333", True),  # a number with no finite decimal: its decimal within 1e-6
        ("0.5", "1/2", True),
        ("3", "3.000", True),
        ("3", "9" * 400, False),  # past a float's range: compared exactly, never an OverflowError
        ("3", "The answer is " + "9" * 400, False),
        ("1" + "0" * 400, "1" + "0" * 400, True),
    ],
)
def test_numbers_compare_exactly(gold, text, correct):
    assert numeric_verdict(gold, text).correct is correct


def test_a_batch_with_a_huge_number_is_scored():
    """One completion stating a 400-digit number scores 0; its batch is scored (it raised before)."""
    from envs.dataset_verify import check

    verdicts = [check("numeric", "3", t) for t in ("\\boxed{3}", "\\boxed{" + "9" * 400 + "}")]
    assert [v.correct for v in verdicts] == [True, False]
