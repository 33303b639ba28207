"""How many calls of a user function (a reward function, a tool) may fail before the run stops.

A failing call scores 0 (or returns an error to the model) and the run goes on: one bad
sample, a blip of a judge service. A function that fails for most of its calls is broken
(a bug, a service that is down), and training on its zeros wastes the run. `FailureBudget`
counts, per function, the calls of one step that ended in an error or a timeout; past
``max_fraction`` of that function's calls it raises `CallsFailedError` naming the function,
how many calls failed, and its first distinct errors (the last line of each traceback).
`FailureBudget.exceeded` also answers while calls still run: once the failures already
counted exceed the budget, whatever the remaining calls do, the step can stop at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_mp.utils.errors import RunFailed

_SHOWN_ERRORS = 3


class CallsFailedError(RunFailed):
    """Too many calls of one user function failed in a step: the run stops (one line)."""


@dataclass(frozen=True, slots=True)
class FailureBudget:
    kind: str
    """What the functions are, for the message: ``reward function``, ``tool``."""
    setting: str
    """The config key of ``max_fraction``, for the message: ``reward.max_failure_fraction``."""
    max_fraction: float
    """Failed calls / calls of one function in one step above this stop the run; 1.0: never."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_fraction <= 1.0:
            raise ValueError(f"{self.setting}={self.max_fraction} must be in [0, 1] (1: never stop)")

    def exceeded(self, names: Sequence[str], statuses: Sequence[str | None]) -> str | None:
        """The first function whose failed calls exceed the budget already; ``statuses[i]``
        is call i's: ``ok``, another word (failed), or None (still running)."""
        totals: dict[str, list[int]] = {}
        for name, status in zip(names, statuses, strict=True):
            entry = totals.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += status is not None and status != "ok"
        for name, (calls, failed) in totals.items():
            if failed > self.max_fraction * calls:
                return name
        return None

    def check(self, names: Sequence[str], statuses: Sequence[str | None], messages: Sequence[str]) -> None:
        """Raise `CallsFailedError` if a function's failed calls exceed the budget."""
        name = self.exceeded(names, statuses)
        if name is None:
            return
        mine = [(s, m) for n, s, m in zip(names, statuses, messages, strict=True) if n == name]
        failed = [(s, m) for s, m in mine if s is not None and s != "ok"]
        distinct: list[str] = []
        for status, message in failed:
            line = f"[{status}] {message}"
            if line not in distinct:
                distinct.append(line)
        shown = "; ".join(distinct[:_SHOWN_ERRORS])
        more = f" (and {len(distinct) - _SHOWN_ERRORS} other distinct errors)" if len(distinct) > _SHOWN_ERRORS else ""
        not_run = sum(s is None for s, _ in mine)
        stopped = f" ({not_run} not run: stopped once the budget was exceeded)" if not_run else ""
        raise CallsFailedError(
            f"{self.kind} {name!r} failed {len(failed)} of its {len(mine)} calls in this step{stopped}, more than "
            f"{self.setting}={self.max_fraction:g} of them; its first errors: {shown}{more}. Fix the function "
            f"(or the service it calls), or raise {self.setting} to train on with failed calls scored 0 "
            "(1.0: never stop)")
