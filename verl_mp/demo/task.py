"""A seeded synthetic arithmetic task ("What is 37+48?" -> "#### 85") in the prompt schema.

Used by the embedded demo and tests: small enough for a tiny model to learn, checked by
the ``arith_exact`` rule reward (data_source ``synthetic_arith``). Test problems never
appear in the train split. ``second_digits`` narrows the second operand (the demo uses
``What is 374+8?``: three digits and one), which a tiny model learns in about a minute.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from verl_mp.data.schema import write_rows

DATA_SOURCE = "synthetic_arith"
OPERATORS = ("+", "-")


def make_problem(
    rng: random.Random, max_digits: int, allow_negative: bool, second_digits: int | None = None,
) -> tuple[int, str, int]:
    """Draw (a, op, b): a has 1..max_digits digits, b 1..second_digits (default max_digits)."""
    a = rng.randint(0, 10**max_digits - 1)
    b = rng.randint(0, 10 ** (second_digits or max_digits) - 1)
    op = rng.choice(OPERATORS)
    if op == "-" and not allow_negative and b > a:
        a, b = b, a
    return a, op, b


def problem_row(a: int, op: str, b: int, split: str, index: int) -> dict[str, Any]:
    """One row in the prompt schema; the answer is the exact integer result as a string."""
    answer = a + b if op == "+" else a - b
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"What is {a}{op}{b}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "op": op},
    }


def make_rows(
    num_rows: int, seed: int, split: str, max_digits: int = 2, allow_negative: bool = False,
    exclude: set[tuple[int, str, int]] | None = None, second_digits: int | None = None,
) -> list[dict[str, Any]]:
    """``num_rows`` distinct problems drawn with ``random.Random(seed)``, none in ``exclude``."""
    second_digits = second_digits or max_digits
    if not 1 <= second_digits <= max_digits:
        raise ValueError(f"second_digits={second_digits} must be in 1..max_digits={max_digits}")
    # Over 1.5 * 10**(max_digits + second_digits) distinct problems exist; staying below
    # 10**(max_digits + second_digits) keeps rejection sampling quick.
    limit = 10 ** (max_digits + second_digits)
    if num_rows + len(exclude or ()) > limit:
        raise ValueError(
            f"{num_rows} distinct problems with max_digits={max_digits}, "
            f"second_digits={second_digits} is too many (limit {limit}). "
            "Fix: raise max_digits or second_digits, or ask for fewer rows."
        )
    rng = random.Random(f"{seed}:{split}")
    seen = set(exclude or ())
    rows = []
    while len(rows) < num_rows:
        problem = make_problem(rng, max_digits, allow_negative, second_digits)
        if problem not in seen:
            seen.add(problem)
            rows.append(problem_row(*problem, split=split, index=len(rows)))
    return rows


def write_synthetic_dataset(
    output_dir: str | Path, num_train: int = 2048, num_test: int = 256, seed: int = 0,
    max_digits: int = 2, allow_negative: bool = False, second_digits: int | None = None,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under output_dir; return their paths."""
    output_dir = Path(output_dir)
    test = make_rows(num_test, seed, "test", max_digits, allow_negative,
                     second_digits=second_digits)
    test_keys = {(r["extra_info"]["a"], r["extra_info"]["op"], r["extra_info"]["b"]) for r in test}
    train = make_rows(num_train, seed, "train", max_digits, allow_negative, exclude=test_keys,
                      second_digits=second_digits)
    train_path = write_rows(train, output_dir / "train.parquet")
    return train_path, write_rows(test, output_dir / "test.parquet")
