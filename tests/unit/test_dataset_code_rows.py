"""The dataset environment's ``code`` rows (``envs/dataset_verify.py``): without ``entry_field`` the function
under test is the first name the asserts call that is not a Python builtin (MBPP's ``assert
set(similar_elements(...))`` tests ``similar_elements``, not ``set``); a HumanEval-form row whose prompt
defines helpers its tests call (``encode_cyclic``) runs that prompt beside the tests, as HumanEval's harness
does, so a right answer passes."""

from __future__ import annotations

import pytest

from envs.dataset_verify import code_outcomes, code_tests, trusted_prompt


@pytest.mark.parametrize(
    ("tests", "entry"),
    [
        (["assert set(similar_elements((3, 4), (4, 5))) == set((4,))"], "similar_elements"),
        (["assert round(circle_area(1), 2) == 3.14"], "circle_area"),
        (["assert sorted(f([2, 1])) == [1, 2]", "assert g(1) == 1"], "f"),
        (["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)"], "area"),  # a method is not it either
        (["assert not is_odd(2)"], "is_odd"),
        (["assert add(1, 2) == 3"], "add"),
        (["assert abs(-1) == 1"], "abs"),  # only builtins: the first of them, as before
    ],
)
def test_the_entry_point_is_the_first_function_called_that_is_not_a_builtin(tests, entry):
    src, got = code_tests(tests, None, "mbpp.jsonl", 0)
    assert got == entry and src.startswith("def check(candidate):")


ENCODE = '''def encode_cyclic(s: str):
    """Cycle each group of three characters."""
    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]
    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]
    return "".join(groups)


def decode_cyclic(s: str):
    """Take a string encoded with encode_cyclic and return the decoded string."""
'''
TEST = """def check(candidate):
    for word in ("abcdef", "hello world", "xy"):
        assert candidate(encode_cyclic(word)) == word
"""


def test_a_prompt_of_helpers_the_tests_call_is_trusted_code():
    assert trusted_prompt(ENCODE, TEST, "decode_cyclic") == ENCODE
    assert trusted_prompt("Write decode_cyclic.", TEST, "decode_cyclic") == ""  # words: nothing runs
    assert trusted_prompt([{"role": "user", "content": ENCODE}], TEST, "decode_cyclic") == ""
    unused = "def decode_cyclic(s):\n    'Decode.'\n"  # only the function itself: HumanEval/0's form
    assert trusted_prompt(unused, TEST.replace("encode_cyclic(word)", "word"), "decode_cyclic") == ""
    acting = ENCODE + "print('side effect')\n"  # a statement that does something is no prompt of definitions
    assert trusted_prompt(acting, TEST, "decode_cyclic") == ""


def test_a_right_answer_to_a_row_whose_tests_call_the_prompts_helper_passes():
    right = "    return encode_cyclic(encode_cyclic(s))\n"  # continues the prompt, as HumanEval's answers do
    (got,) = code_outcomes([({"prompt": ENCODE, "test": TEST, "entry": "decode_cyclic"}, right)], workers=1)
    assert got["correct"] is True and got["flags"] == [], got
