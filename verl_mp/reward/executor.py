"""Runs reward-function calls with exception capture and a per-call timeout.

Why processes: a Python thread cannot be stopped, so a hanging reward function in a
thread pool would block forever (and block interpreter exit). Calls therefore run in a
small ``multiprocessing`` pool (``spawn``, so no CUDA/threads state is forked):

1. Each call runs under a ``SIGALRM`` timer in the worker's main thread: a call that runs
   longer than ``timeout_s`` is interrupted and the worker goes on with the next call.
2. Backstop for code that never returns to the interpreter (a C extension stuck without
   checking signals): the batch waits at most ``backstop_grace_s + 1.5 * timeout_s *
   (calls per worker)``; calls still unfinished (also those queued behind the stuck one)
   are counted as timeouts and the pool is killed (``Pool.terminate``, a public API that
   ``concurrent.futures`` on Python 3.11 lacks) and started again for the next batch.

``num_workers=0`` runs calls inline in the caller (exceptions captured, no timeout):
for debugging, or for functions that cannot be pickled.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """Result of one call: status "ok" (score set), "error" or "timeout" (message set)."""

    status: str
    score: float = 0.0
    extras: dict[str, float] | None = None
    message: str = ""


class _CallTimeout(BaseException):
    """Raised by the alarm; a BaseException so a user's ``except Exception`` cannot eat it."""


def normalize_result(value: Any) -> tuple[float, dict[str, float]]:
    """A reward fn's return -> (score, numeric extras); TypeError/ValueError if unusable."""
    extras: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without a 'score' key: keys {sorted(value)}")
        extras = {k: float(v) for k, v in value.items()
                  if k != "score" and isinstance(v, (int, float)) and math.isfinite(float(v))}
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"returned {type(value).__name__} {value!r}; expected a float or "
                        "a dict with a float 'score'")
    if not math.isfinite(float(value)):
        raise ValueError(f"returned a non-finite score {value}")
    return float(value), extras


def call_safely(fn: Callable[..., Any], args: tuple, timeout_s: float | None) -> Outcome:
    """Call ``fn(*args)``; never raises. The timer needs the main thread (pool workers)."""
    use_alarm = timeout_s is not None and timeout_s > 0
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
        score, extras = normalize_result(value)
        return Outcome("ok", score, extras)
    except _CallTimeout:
        return Outcome("timeout", message=f"took longer than {timeout_s}s")
    except Exception as err:  # noqa: BLE001  (a failing reward must never crash the run)
        return Outcome("error", message=f"{type(err).__name__}: {err}")


def _raise_timeout(signum: int, frame: Any) -> None:
    raise _CallTimeout()


def _run_chunk(calls: list[tuple[Callable[..., Any], tuple]], timeout_s: float) -> list[Outcome]:
    """Worker side: run a chunk of calls one by one, each under its own timer."""
    return [call_safely(fn, args, timeout_s) for fn, args in calls]


def _init_worker() -> None:
    """Workers ignore Ctrl-C: the trainer handles it and tears the pool down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RewardExecutor:
    """Runs lists of ``(fn, args)`` calls; returns one Outcome per call, in order."""

    def __init__(
        self, num_workers: int = 4, timeout_s: float = 10.0, chunks_per_worker: int = 4,
        backstop_grace_s: float = 30.0,
    ):
        """``backstop_grace_s``: allowance for spawning workers and importing reward modules."""
        if num_workers < 0 or timeout_s <= 0:
            raise ValueError(f"reward num_workers={num_workers} must be >= 0 and "
                             f"timeout_s={timeout_s} > 0")
        if num_workers == 0:
            logger.warning("reward num_workers=0: reward functions run inline and "
                           "timeout_s=%s has no effect (exceptions are still caught)", timeout_s)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.chunks_per_worker = chunks_per_worker
        self.backstop_grace_s = backstop_grace_s
        self._pool: Any = None

    def run(self, calls: list[tuple[Callable[..., Any], tuple]]) -> list[Outcome]:
        """Run every call; failures and timeouts become Outcomes, never exceptions."""
        if self.num_workers == 0 or not calls:
            return [call_safely(fn, args, None) for fn, args in calls]
        size = max(1, math.ceil(len(calls) / (self.num_workers * self.chunks_per_worker)))
        chunks = [calls[i : i + size] for i in range(0, len(calls), size)]
        pool = self._get_pool()
        pending = [pool.apply_async(_run_chunk, (chunk, self.timeout_s)) for chunk in chunks]
        rounds = math.ceil(len(chunks) / self.num_workers)
        deadline = time.monotonic() + self.backstop_grace_s + 1.5 * self.timeout_s * size * rounds
        outcomes: list[Outcome] = []
        stuck = False
        for chunk, result in zip(chunks, pending, strict=True):
            try:
                outcomes.extend(result.get(timeout=max(0.0, deadline - time.monotonic())))
            except multiprocessing.TimeoutError:
                stuck = True
                outcomes.extend(Outcome("timeout", message="worker stuck past the backstop")
                                for _ in chunk)
            except Exception as err:  # noqa: BLE001  (e.g. an unpicklable result)
                outcomes.extend(Outcome("error", message=f"{type(err).__name__}: {err}")
                                for _ in chunk)
        if stuck:
            logger.warning("reward worker stuck in uninterruptible code; restarting the pool")
            self.close()
        return outcomes

    def _get_pool(self) -> Any:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = context.Pool(self.num_workers, initializer=_init_worker)
        return self._pool

    def close(self) -> None:
        """Kill the worker processes (a later ``run`` starts new ones)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: nothing left to do)
            pass
