"""Rule rewards: GSM8K ``#### answer``, boxed math answers, exact-match arithmetic, format.

All return ``{"score": 1.0 or 0.0, "acc": ...}`` (or a plain float for ``format``) and
take the registry signature ``fn(data_source, solution_str, ground_truth, extra_info)``.
Responses should be decoded without special tokens. Numbers are compared exactly with
``fractions.Fraction``, so ``0.5 == 1/2 == \\frac{1}{2}`` and ``72.0 == 72``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

# A number: optional sign, thousands-grouped or plain digits, optional decimals.
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_HASH_ANSWER = re.compile(r"####\s*(-?)\s*\$?\s*(" + _NUM + ")")
_HASH_LINE = re.compile(r"####\s*-?\$?\s*(?:" + _NUM + r")\s*\.?")
_FRAC = re.compile(r"^\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_FRAC_SHORT = re.compile(r"^\\frac(\d)(\d)$")
_SLASH = re.compile(r"^([^/]+)/([^/]+)$")
_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "\\%", "%",
                "^\\circ", "^{\\circ}")


def parse_number(text: str) -> Fraction | None:
    """``-1,234.5`` / ``.5`` / ``+3`` -> exact Fraction; anything else -> None."""
    text = text.strip()
    if not re.fullmatch(_NUM, text):
        return None
    return Fraction(text.replace(",", ""))


def extract_hash_answer(text: str) -> str | None:
    """The number after the last ``####`` (commas and ``$`` removed), or None."""
    matches = _HASH_ANSWER.findall(text)
    if not matches:
        return None
    sign, number = matches[-1]
    number = number.replace(",", "")
    if sign and not number.startswith(("-", "+")):
        number = "-" + number
    return number


def gsm8k_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, float]:
    """1.0 if the last ``#### <number>`` in the response equals the ground truth numerically."""
    predicted = extract_hash_answer(solution_str)
    target = extract_hash_answer(ground_truth) if "####" in ground_truth else ground_truth
    ok = predicted is not None and target is not None and _numbers_equal(predicted, target)
    return {"score": float(ok), "acc": float(ok)}


def _numbers_equal(a: str, b: str) -> bool:
    fa, fb = parse_number(a), parse_number(b)
    return fa is not None and fb is not None and fa == fb


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept), or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if not rest.startswith("{"):  # "\boxed 5" form: one whitespace-separated token
        tokens = rest.split()
        return tokens[0].strip("$.") if rest[:1].isspace() and tokens else None
    return _braced_prefix(rest)


def _braced_prefix(text: str) -> str | None:
    """For text starting with ``{``, the content up to its matching ``}``; None if unbalanced."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[1:i]
    return None


def normalize_math(text: str) -> str:
    """Drop LaTeX spacing/sizing, ``$``, %, degrees, outer braces; ``dfrac`` -> ``frac``."""
    text = text.strip()
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", text)
    text = "".join(text.split()).rstrip(".")
    while text.startswith("{") and _braced_prefix(text) == text[1:-1]:
        text = text[1:-1]
    return text


def math_value(text: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}`` answer, else None."""
    text = normalize_math(text)
    sign = -1 if text.startswith("-") and text[1:2] == "\\" else 1
    body = text[1:] if sign < 0 else text
    for pattern in (_FRAC, _FRAC_SHORT, _SLASH):
        match = pattern.match(body)
        if match:
            num, den = parse_number(match.group(1)), parse_number(match.group(2))
            if num is None or den is None or den == 0:
                return None
            return sign * num / den
    return parse_number(body) if sign > 0 else None


def math_equal(predicted: str, target: str) -> bool:
    """Numeric equality when both parse (``\\frac{1}{2}`` == ``0.5``), else normalized text."""
    a, b = math_value(predicted), math_value(target)
    if a is not None and b is not None:
        return a == b
    a_text, b_text = normalize_math(predicted), normalize_math(target)
    return bool(a_text) and a_text == b_text


def boxed_math_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, float]:
    """1.0 if the last ``\\boxed{}`` answer equals the ground truth (itself boxed or plain)."""
    predicted = last_boxed(solution_str)
    target = last_boxed(ground_truth) if "\\boxed" in ground_truth else ground_truth
    ok = predicted is not None and target is not None and math_equal(predicted, target)
    return {"score": float(ok), "acc": float(ok)}


def arith_exact_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, float]:
    """1.0 if the text after the last ``####`` (or, without one, the whole response),
    stripped, is exactly the ground truth: ``085`` does not match ``85``."""
    lines = solution_str.rpartition("####")[2].strip().splitlines()
    ok = bool(lines) and lines[0].strip() == ground_truth.strip()
    return {"score": float(ok), "acc": float(ok)}


def format_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 if the last non-empty line of the response is ``#### <number>``; ignores correctness."""
    lines = [line for line in solution_str.splitlines() if line.strip()]
    return float(bool(lines) and _HASH_LINE.fullmatch(lines[-1].strip()) is not None)


def arith_tool_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None,
    trajectory: dict[str, Any] | None = None,
) -> dict[str, float]:
    """`arith_exact_reward` on the final answer of a multi-turn conversation, with what the
    trajectory shows as metrics: ``reward/called_tool/mean`` (a tool answered the model) and
    ``reward/tool_turns/mean`` (assistant turns). Without a trajectory (single-turn) the same as
    ``arith_exact``."""
    result = arith_exact_reward(data_source, solution_str, ground_truth, extra_info)
    if trajectory is not None:
        answered = [m for m in trajectory["messages"] if m["role"] == "tool" and m.get("appended", True)]
        result["called_tool"] = float(any(m["status"] == "ok" for m in answered))
        result["tool_turns"] = float(trajectory["num_turns"])
    return result
