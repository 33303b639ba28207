"""Hand-written cases for every rule reward, tricky ones included."""

import pytest

from verl_mp.reward.rules import (
    arith_exact_reward,
    boxed_math_reward,
    extract_hash_answer,
    format_reward,
    gsm8k_reward,
    last_boxed,
    math_equal,
)

pytestmark = pytest.mark.unit


def score(fn, response, ground_truth):
    result = fn("src", response, ground_truth, None)
    return result["score"] if isinstance(result, dict) else result


@pytest.mark.parametrize("response, truth, expected", [
    ("3+4=7\n#### 7", "7", 1.0),
    ("so #### 1,000", "1000", 1.0),            # thousands separator in the response
    ("#### $1,234.50", "1234.5", 1.0),         # dollar sign, decimals
    ("#### 72.0", "72", 1.0),                  # numeric, not string, comparison
    ("#### -3", "-3", 1.0),                    # negative
    ("#### -3", "3", 0.0),
    ("#### 5 first, then #### 6", "6", 1.0),   # the last answer counts
    ("#### 6\nmore words #### 5", "6", 0.0),
    ("the answer is 7", "7", 0.0),             # no #### at all
    ("#### seven", "7", 0.0),
    ("#### 7", "3+4\n#### 7", 1.0),            # a full solution as ground truth
])
def test_gsm8k(response, truth, expected):
    assert score(gsm8k_reward, response, truth) == expected


def test_extract_hash_answer():
    assert extract_hash_answer("#### - $7") == "-7"
    assert extract_hash_answer("#### 12,34") == "12"  # not a valid thousands group
    assert extract_hash_answer("nothing") is None


@pytest.mark.parametrize("response, truth, expected", [
    (r"so $\boxed{\frac{1}{2}}$", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac12}", "1/2", 1.0),
    (r"\boxed{-\frac{3}{4}}", "-0.75", 1.0),
    (r"\boxed{\frac{-3}{4}}", r"-\frac{3}{4}", 1.0),
    (r"\boxed{2/4}", "0.5", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{42}", r"The answer is \boxed{42}.", 1.0),
    (r"\boxed{\frac{1}{3}}", "0.33", 0.0),          # exact, not approximate
    (r"\boxed{1} then \boxed{2}", "2", 1.0),        # last box counts
    (r"\boxed{x^{2}+\sqrt{2}}", r"x^{2} + \sqrt{2}", 1.0),  # nested braces, text fallback
    (r"\boxed{\frac{1}{0}}", "0", 0.0),
    (r"\boxed{3", "3", 0.0),                         # unbalanced
    ("the answer is 3", "3", 0.0),                   # no box
])
def test_boxed_math(response, truth, expected):
    assert score(boxed_math_reward, response, truth) == expected


def test_last_boxed_forms():
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert last_boxed(r"\boxed 5.") == "5"
    assert last_boxed(r"\fbox{7}") == "7"
    assert math_equal(r"\left(3\right)", "(3)") and math_equal("50\\%", "50")


@pytest.mark.parametrize("response, truth, expected", [
    ("#### 85", "85", 1.0),
    ("37+48=85\n#### 85\n", "85", 1.0),
    ("85", "85", 1.0),         # bare answer
    ("#### 085", "85", 0.0),   # exact match only
    ("#### 85.0", "85", 0.0),
    ("#### -11", "-11", 1.0),
    ("", "85", 0.0),
])
def test_arith_exact(response, truth, expected):
    assert score(arith_exact_reward, response, truth) == expected


@pytest.mark.parametrize("response, expected", [
    ("work\n#### 85", 1.0),
    ("#### -1,000.5\n\n", 1.0),
    ("#### 85 apples", 0.0),
    ("#### 85\nmore text", 0.0),
    ("85", 0.0),
    ("", 0.0),
])
def test_format(response, expected):
    assert score(format_reward, response, "ignored") == expected
