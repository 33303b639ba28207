"""One reward call, contained: exceptions captured, results checked, a per-call timer.

Shared by the executor (`verl_mp.reward.executor`, inline calls) and its worker processes
(`verl_mp.reward.worker_proc`).
"""

from __future__ import annotations

import math
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Outcome:
    """Result of one call: status "ok" (score set), "error" or "timeout" (message set)."""

    status: str
    score: float = 0.0
    extras: dict[str, float] | None = None
    message: str = ""
    text: str = ""
    """What a call made with ``text=True`` returned (a tool's answer; `verl_mp.reward.tool_pool`)."""


class _CallTimeout(BaseException):
    """Raised by the alarm; a BaseException so a user's ``except Exception`` cannot eat it."""


def _plain_number(value: Any) -> Any:
    """numpy scalars (``np.float32(0.5)``, ``np.int64(1)``) and 0-d numpy arrays or torch
    tensors as the Python number they hold (``.item()``); anything else unchanged."""
    if isinstance(value, (bool, int, float)):
        return value
    item = getattr(value, "item", None)
    if callable(item) and tuple(getattr(value, "shape", (None,))) == ():
        return item()
    return value


def normalize_result(value: Any) -> tuple[float, dict[str, float]]:
    """A reward fn's return -> (score, numeric extras); TypeError/ValueError if unusable.

    The score (or the dict's ``"score"``) is a real number: a Python int or float, a numpy
    scalar, or a 0-d numpy array / torch tensor; not a bool, not NaN or infinite. Extras
    that are not finite real numbers are left out."""
    extras: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without a 'score' key: keys {sorted(value)}")
        for key, extra in value.items():
            extra = _plain_number(extra)
            if key != "score" and isinstance(extra, (int, float)) and math.isfinite(float(extra)):
                extras[key] = float(extra)
        value = value["score"]
    number = _plain_number(value)
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise TypeError(f"returned {type(value).__name__} {value!r}; expected a float or "
                        "a dict with a float 'score'")
    if not math.isfinite(float(number)):
        raise ValueError(f"returned a non-finite score {number}")
    return float(number), extras


def call_safely(fn: Callable[..., Any], args: tuple, timeout_s: float | None, text: bool = False) -> Outcome:
    """Call ``fn(*args)``; never raises. The timer needs the main thread (pool workers).
    ``text``: the result is a tool's answer, kept as ``Outcome.text`` (``str(value)``), not a score.

    A call that returns after ``timeout_s`` counts as a timeout even if it has a result:
    the alarm did not fire because the reward function's own code replaced or cancelled it.
    """
    use_alarm = timeout_s is not None and timeout_s > 0
    start = time.monotonic()
    try:
        previous = signal.signal(signal.SIGALRM, _raise_timeout) if use_alarm else None
        try:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
            value = fn(*args)
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
        if use_alarm and time.monotonic() - start > timeout_s:
            return Outcome("timeout", message=f"took {time.monotonic() - start:.1f}s > {timeout_s}s "
                                              "(the reward function's code cancelled the alarm)")
        if text:
            return Outcome("ok", text=value if isinstance(value, str) else str(value))
        score, extras = normalize_result(value)
        return Outcome("ok", score, extras)
    except _CallTimeout:
        return Outcome("timeout", message=f"took longer than {timeout_s}s")
    except Exception as err:  # noqa: BLE001  (counted against reward.max_failure_fraction)
        return Outcome("error", message=error_line(err))


def _raise_timeout(signum: int, frame: Any) -> None:
    raise _CallTimeout()


def error_line(err: BaseException) -> str:
    """The last line of ``err``'s traceback, and where it was raised: ``ZeroDivisionError:
    division by zero (judge.py:12 in score)``."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"
