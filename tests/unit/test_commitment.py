"""The ``math`` and ``numeric`` verifiers pay only the one value an answer commits to
(``envs/commitment.py``): every way of offering several candidates scores 0, against a gold answer in either
position of the hedge (a verifier reading the last value pays "13 or 12" when 12 is the gold answer, and
"12 or 13" when 13 is); the honest forms keep scoring 1; a gold answer that is itself a set, interval, tuple
or list matches its own form."""

from __future__ import annotations

import json

import pytest

from envs.base import make_env
from envs.commitment import math_verdict, numeric_verdict
from envs.dataset_verify import check, final_answer
from rl_core.schema.config import Config

# "<a>" and "<b>" are the two candidates; each hedge is tried with the gold answer as a and as b.
HEDGES = [
    "<a> or <b>",
    "**<a>** or **<b>**",
    "either <a> or <b>",
    "x = <a> or x = <b>",
    "$x=<a>$ or $x=<b>$",
    "<a>, <b>",
    "<a>; <b>",
    "<a> <b>",
    "<a>\n<b>",
    "<a> and <b>",
    "<a> (or <b>)",
    "It is <a>, or perhaps <b>",
    "The answer is <a> or <b>.",
    "Answer: <a>, <b>",
    "#### <a> or <b>",
    "$\\{<a>, <b>\\}$",
    "$x \\in \\{<a>, <b>\\}$",
    "$x = <a>, <b>$",
    "$[<a>, <b>]$",
    "$(<a>, <b>)$",
    "$<a> \\lor <b>$",
    "$<a> \\vee <b>$",
    "$<a> \\cup <b>$",
    "$<a>$ $<b>$",
    "$<a>$, $<b>$",
    "\\boxed{<a>} \\boxed{<b>}",
    "\\boxed{<a>} and then \\boxed{<b>}",
    "\\boxed{<a>, <b>}",
    "\\boxed{<a> \\text{ or } <b>}",
    "\\boxed{x=<a> \\text{ or } x=<b>}",
    "\\boxed{\\{<a>, <b>\\}}",
    "\\boxed{<a> \\vee <b>}",
    "<think>hmm</think> <a> or <b>",
    "<think>it is 12</think> \\boxed{<a>} \\boxed{<b>}",
    # hedging words, list and range marks between two numbers, asides, what follows a box (stop 65's review)
    "<a> maybe <b>",
    "<a> vs <b>",
    "<a> through <b>",
    "<a> 或 <b>",
    "<a> | <b>",
    "<a> – <b>",
    "<a>...<b>",
    "<a> or about <b>",
    "The answer is <a> (possibly <b>)",
    "The answer is <a> (<b>?)",
    "\\boxed{<a> \\mid <b>}",
    "\\boxed{<a> \\\\ <b>}",
    "\\boxed{<a>~<b>}",
    "\\boxed{<a>\\,<b>}",
    "\\boxed{<a> \\text{ (or <b>)}}",
    "$<a> \\,|\\, <b>$",
    "\\boxed{<a>}, or maybe it's <b>",
    "\\boxed{<a>}, or maybe <b> (not <a>)",  # the box's own text again after the alternative
    "\\boxed{<a>} \\boxed <b>",
    "\\boxed{<a>} \\framebox{<b>}",
    "<answer><a></answer> <answer><b></answer>",
    "<answer><a> or <b></answer>",
]
PLUS_MINUS = ["$12 \\pm 1$", "$\\pm 12$", "12 ± 1", "$12 \\mp 1$", "\\boxed{\\pm 12}"]
HONEST = [
    "12 (not 13)",
    "The answer is 12 (since 12 > 11).",
    "The answer is 12 -> done",
    "<answer>12</answer>",
    "<think>3*4</think><answer> 12 </answer>",
    "\\[12\\]",
    "\\boxed{\\phantom{4}12}",
    "\\boxed{12}. Or we could check it with 3*4.",
    "1\u200b2",
    "\\boxed{12}",
    "$12$",
    "x = 12",
    "x = $12$",
    "12",
    "The answer is 12.",
    "So the answer is $12$.",
    "The final answer is $\\boxed{12}$",
    "Answer: 12",
    "#### 12",
    "3 x 4 = 12",
    "We get 12 apples.",
    "\\boxed{12} \\boxed{12}",
    "The answer is 12 (3 times 4).",
    "**Answer:** 12",
    "The answer is **12**.",
    "Final answer: 12",
    "<think>maybe 13 or 11? no: 3*4 = 12</think> \\boxed{12}",
    "<think>13, 11 or 12</think>\nx = 12",
]


@pytest.mark.parametrize("verdict", [math_verdict, numeric_verdict], ids=["math", "numeric"])
@pytest.mark.parametrize("form", HEDGES)
@pytest.mark.parametrize("gold_first", [True, False], ids=["gold-first", "gold-last"])
def test_a_hedge_scores_zero_wherever_the_gold_answer_sits(verdict, form, gold_first):
    a, b = ("12", "13") if gold_first else ("13", "12")
    region = final_answer(form.replace("<a>", a).replace("<b>", b))
    v = verdict("12", region)
    assert not v.correct and not v.well_formed, (form, v)
    assert v.hedge, (form, v)


@pytest.mark.parametrize("verdict", [math_verdict, numeric_verdict], ids=["math", "numeric"])
@pytest.mark.parametrize("form", PLUS_MINUS)
def test_plus_minus_is_two_answers(verdict, form):
    v = verdict("12", form)
    assert not v.correct and not v.well_formed and v.hedge.startswith("a several-values mark")


@pytest.mark.parametrize("verdict", [math_verdict, numeric_verdict], ids=["math", "numeric"])
@pytest.mark.parametrize("form", HONEST)
def test_honest_answers_keep_their_reward(verdict, form):
    v = verdict("12", final_answer(form))
    assert v.correct and v.well_formed and v.hedge is None, (form, v)
    assert not verdict("13", final_answer(form)).correct  # and they pay only for 12


@pytest.mark.parametrize(
    "gold,answer",
    [
        ("\\{1, 2\\}", "$\\{2, 1\\}$"),
        ("[1, 2]", "$[1,2]$"),
        ("(1,2)", "$(1,2)$"),
        ("\\pm 3", "$\\pm 3$"),
        ("1, 2", "\\boxed{1, 2}"),
        ("x=1 \\text{ or } x=2", "\\boxed{x=1 \\text{ or } x=2}"),
        ("\\frac{1}{2}", "so the answer is \\boxed{0.5}"),
        ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ],
)
def test_a_gold_answer_of_several_values_matches_its_own_form(gold, answer):
    v = math_verdict(gold, answer)
    assert v.correct and v.hedge is None, v


@pytest.mark.parametrize(
    "gold,answer",
    [
        ("\\{1,2\\}", "\\boxed{\\{1,2\\}} \\boxed{\\{1,2,3\\}}"),  # boxes that disagree
        ("[1,2]", "$[1,2]$ or $[1,3]$"),  # a disjunction of two intervals
        ("\\{1,2\\}", "$\\{1,2,3\\}$"),  # a superset is another set
    ],
)
def test_a_set_gold_answer_is_not_paid_by_a_hedge_between_sets(gold, answer):
    assert not math_verdict(gold, answer).correct


def test_a_list_of_every_number_is_not_an_answer():
    spray = ", ".join(str(i) for i in range(100))
    for verdict in (math_verdict, numeric_verdict):
        v = verdict("42", spray)
        assert not v.correct and v.hedge


def test_the_environment_records_the_hedge(tmp_path):
    rows = [{"q": f"{i}+{i}?", "a": str(2 * i)} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = {"train": str(tmp_path / "d.jsonl"), "heldout_fraction": 0.5}
    args |= {"prompt_field": "q", "answer_field": "a"}
    env = make_env("dataset", {**args, "verifier": "math"})
    task = next(t for t in env.tasks("train", Config().task, 0) if t["answer"] == "2")
    hedged, honest = env.step_many([(task, "3 or 2"), (task, "<think>3?</think> \\boxed{2}")])
    assert hedged.outcome["hedge"].startswith("several candidates") and not hedged.outcome["correct"]
    assert honest.outcome["correct"] and honest.outcome["hedge"] == ""
    assert check("numeric", "4", "4 or 5").hedge


# -- what the second audit found: negated and bounded answers, signs, digits, text answers, towers ----------
@pytest.mark.parametrize(
    ("verifier", "gold", "text", "correct"),
    [
        ("math", "42", "the answer is not 42", False),
        ("math", "42", "It cannot be 42", False),
        ("math", "42", r"\boxed{\neq 42}", False),
        ("math", "42", r"\boxed{\geq 42}", False),
        ("math", "42", r"$\approx 42$", False),
        ("math", "42", "at least 42", False),
        ("numeric", "42", "not 42", False),
        ("numeric", "42", "more than 42", False),
        ("math", "42", "The answer is 42, not 43.", True),  # the negated piece is no candidate
        ("numeric", "42", "42, not 43", True),
        ("math", "7", "\u22127", False),  # U+2212, the minus sign: -7, not 7
        ("math", "-7", "\u22127", True),
        ("numeric", "7", "\u22127", False),
        ("numeric", "-7", "x = \u22127", True),
        ("math", "42", "\uff14\uff12", True),  # full-width digits
        ("numeric", "12", "1,2", False),  # commas group thousands only
        ("numeric", "1234", "1,234", True),
        ("math", "True", r"\boxed{\text{True}}", True),  # a word is one value
        ("math", "Yes", r"\boxed{\text{Yes}}", True),
        ("math", "Yes", r"\boxed{\text{No}}", False),
    ],
)
def test_negations_signs_and_words(verifier, gold, text, correct):
    assert check(verifier, gold, text).correct is correct


@pytest.mark.parametrize(
    "text",
    [
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{9^{9^{9^{1}}}} \boxed{9^{9^{9^{2}}}} \boxed{9^{9^{9^{3}}}} \boxed{9^{9^{9^{4}}}}",
        "9^9^9",
        "10**10**10",
        r"\boxed{10^{123456}}",
        r"\boxed{123456!}",
    ],
)
def test_numbers_too_large_to_compute_are_no_answer_and_cost_no_time(text):
    import time

    t0 = time.perf_counter()
    v = math_verdict("42", text)
    assert not v.correct
    assert time.perf_counter() - t0 < 3  # before: 7.6 s a box, 30 s for four


@pytest.mark.parametrize(
    "text",
    [
        r"\boxed{(x+1)^{9999}}",
        r"\boxed{(10^{9999})^{9999}}",
        r"\boxed{\left(9^{9}\right)^{\left(9^{9}\right)}}",
        r"\boxed{(10^{100})!}",
        r"\boxed{\binom{1000000}{500000}}",
    ],
)
def test_huge_work_is_refused_off_the_main_thread_too(text):
    """math-verify's own timeout is SIGALRM, the main thread's only: a stage run on a worker thread (inline
    environments) must not hang on an answer. Before: each ran past 45 s there."""
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(math_verdict("3", text)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), f"{text} still being verified after 30 s"
    assert not out[0].correct


def test_one_answer_has_one_time_budget(monkeypatch):
    """Every parse and comparison of an answer draws on one budget (``BUDGET_S``), so more boxes cannot
    multiply the time; an answer that uses it up scores 0, not well formed, saying why."""
    import envs.commitment as commitment

    assert math_verdict("12", r"\boxed{12}").correct
    monkeypatch.setattr(commitment, "BUDGET_S", 0.0)
    v = math_verdict("12", r"\boxed{12}")
    assert (v.correct, v.well_formed) == (False, False) and "took over" in v.hedge


@pytest.mark.parametrize("verdict", [math_verdict, numeric_verdict])
@pytest.mark.parametrize(
    ("text", "gold", "correct"),
    [
        ("The answer is 12. Check: 5+8=13.", "12", True),  # the check after it is not the answer
        ("The answer is 12. Check: 5+8=13.", "13", False),
        ("The answer is 12! Let me double check: 2+2 = 4.", "12", True),
        ("The answer is 12.\n\n5+8=13 was a step.", "12", True),
        ("The answer is 12. Or 13.", "13", False),  # the sentence commits to 12: no gain over saying 12
        ("The answer is 3.5. It took 2 steps.", "3.5", True),
        ("The answer is approx. 12 apples.", "12", True),  # an abbreviation before a number goes on
    ],
)
def test_a_cued_answer_is_its_sentence(verdict, text, gold, correct):
    """After "the answer is", the answer is its sentence: a check or remark after a full stop (or a blank
    line) does not replace it (math-verify read the last number of the whole text: "The answer is 12.
    Check: 5+8=13." was 13)."""
    assert verdict(gold, text).correct is correct


@pytest.mark.parametrize("verdict", [math_verdict, numeric_verdict])
def test_a_hedge_inside_the_answers_sentence_still_scores_zero(verdict):
    for gold in ("12", "13"):
        got = verdict(gold, "The answer is 12 or 13. Check: both fit.")
        assert not got.correct and got.hedge
