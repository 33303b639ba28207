"""A reward a random model earns: the share of digits in its response.

`gpu_grpo.sh`'s bodies are random, so the task's exact-answer reward is 0 for every sample,
every advantage is 0 and the optimizer never moves the weights: a "gap after the sync" taken
from such a run checks a sync of unchanged weights. With this reward (``REWARD=shaped``) the
samples of a group score differently, the update moves the policy, and each step's sync
carries new weights. A benchmark plugin (``reward.fn_by_source.synthetic_arith=<this
file>:digit_share``), not a task anyone should train for.
"""

from __future__ import annotations

from typing import Any


def digit_share(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """The fraction of the response's non-space characters that are digits (0 for an empty one)."""
    chars = [c for c in solution_str if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0
