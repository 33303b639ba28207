"""Tool calls in the reward functions' sandboxed worker pool, asynchronously.

`ToolPool` is the reward executor (`verl_mp.reward.executor`: worker processes in sessions
of their own, ``setrlimit`` limits, an environment without secrets or GPUs, a per-call
alarm and a watchdog that kills a worker whose call does not return) driven call by call:
`submit` queues a call and returns at once, `poll` hands back the calls that have finished.
A multi-turn rollout submits each turn's tool calls as the turn ends and keeps the engine
busy with the other conversations meanwhile; nothing waits for a batch of calls. A call
that raises, hangs past ``timeout_s`` or kills its worker comes back as an error or a
timeout, never as an exception.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from verl_mp.reward.call import Outcome, call_safely
from verl_mp.reward.executor import RewardExecutor
from verl_mp.reward.tools import ToolFn
from verl_mp.reward.worker_proc import WorkerLimits


@dataclass(slots=True)
class ToolResult:
    status: str
    """``ok``, ``error`` (the tool raised, or its worker died) or ``timeout``."""
    text: str
    """The tool's answer (``ok``), else why it failed."""
    seconds: float
    """From `ToolPool.submit` to the result (queueing included)."""


class ToolPool(RewardExecutor):
    def __init__(self, num_workers: int, timeout_s: float, limits: WorkerLimits | None = None,
                 max_calls_per_worker: int = 1000, kill_grace_s: float = 1.0, start_timeout_s: float = 60.0):
        super().__init__(num_workers=num_workers, timeout_s=timeout_s, limits=limits,
                         max_calls_per_worker=max_calls_per_worker, kill_grace_s=kill_grace_s,
                         start_timeout_s=start_timeout_s)
        self._calls: dict[int, tuple] = {}
        self._keys: dict[int, tuple[Hashable, float]] = {}
        self._outcomes: dict[int, Outcome] = {}
        self._todo: list[int] = []  # popped from the end: insert new calls at the front
        self._next = 0

    def start(self) -> None:
        """Start every worker now (they start on the first calls otherwise): a rollout does
        this when it is built, so that its first tool calls do not wait for interpreters."""
        self._fill(list(range(self.num_workers)))

    @property
    def in_flight(self) -> int:
        """Calls submitted and not yet returned by `poll`."""
        return len(self._keys)

    def submit(self, key: Hashable, fn: ToolFn, arguments: dict[str, Any]) -> None:
        """Queue ``fn(arguments)``; its result comes back from `poll` under ``key``."""
        index, self._next = self._next, self._next + 1
        self._calls[index] = (fn, (arguments,), True)
        self._keys[index] = (key, time.monotonic())
        self._todo.insert(0, index)

    def poll(self, timeout_s: float = 0.0) -> list[tuple[Hashable, ToolResult]]:
        """The calls that finished, waiting up to ``timeout_s`` for the first one when none has."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.num_workers == 0:  # inline (debugging): no timeout, no containment
                while self._todo:
                    index = self._todo.pop()
                    fn, args, _ = self._calls[index]
                    self._outcomes[index] = call_safely(fn, args, None, text=True)
            else:
                self._pump(max(0.0, deadline - time.monotonic()))
            if self._outcomes or time.monotonic() >= deadline or not self._keys:
                return self._collect()

    def _pump(self, wait_s: float) -> None:
        """Start workers, hand idle ones calls, wait for one event (at most ``wait_s``), read it."""
        self._fill(self._todo)
        for worker in list(self._workers):
            if worker.state == "idle" and self._todo:
                self._dispatch(worker, self._todo, self._calls, self._outcomes)
        if self._workers:
            wait([fd for w in self._workers for fd in w.fds()], timeout=min(wait_s, self._wait_s()))
            self._service(self._outcomes, self._todo)

    def _collect(self) -> list[tuple[Hashable, ToolResult]]:
        done, now = [], time.monotonic()
        for index, outcome in self._outcomes.items():
            key, start = self._keys.pop(index)
            del self._calls[index]
            text = outcome.text if outcome.status == "ok" else outcome.message
            done.append((key, ToolResult(outcome.status, text, now - start)))
        self._outcomes = {}
        return done
