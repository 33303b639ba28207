"""Tool calls in the reward functions' sandboxed worker pool, asynchronously.

`ToolPool` is the reward executor (`verl_mp.reward.executor`: worker processes in sessions
of their own, ``setrlimit`` limits, an environment without secrets or GPUs, a per-call
alarm and a watchdog that kills a worker whose call does not return) driven call by call:
`submit` queues a call and returns at once, `poll` hands back the calls that have finished.
A multi-turn rollout submits each turn's tool calls as the turn ends and keeps the engine
busy with the other conversations meanwhile; nothing waits for a batch of calls. A call
that raises, hangs past ``timeout_s`` or kills its worker comes back as an error or a
timeout, never as an exception.

The workers are served by a thread of the pool's own (`start`): it hands each idle worker
the next queued call the moment the worker answers, whatever the caller is doing, and
`poll` only takes the finished results. Before (2026-12-06), the caller's `poll(0)` once per
engine step did the serving: each worker finished at most one call every two engine steps,
so on an H100 (0.5B body, 512 conversations, ~10 ms steps) a calculator call waited 0.94 s
on average and conversations sat idle (benchmarks/tool_pool.py reproduces it on a CPU).
"""

from __future__ import annotations

import os
import threading
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
        self._lock = threading.Condition()
        """Guards the calls, the queue, the outcomes and the workers (the server thread and the caller)."""
        self._server: threading.Thread | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()  # a submit (or close) wakes the server's wait
        os.set_blocking(self._wake_r, False)

    def start(self) -> None:
        """Start every worker now (they start on the first calls otherwise), and the thread
        that serves them: a rollout does this when it is built, so that its first tool calls
        do not wait for interpreters."""
        if self.num_workers == 0 or self._server is not None:
            return
        with self._lock:
            self._fill(list(range(self.num_workers)))
        self._stopping = False
        self._server = threading.Thread(target=self._serve, name="tool-pool", daemon=True)
        self._server.start()

    @property
    def in_flight(self) -> int:
        """Calls submitted and not yet returned by `poll`."""
        return len(self._keys)

    def submit(self, key: Hashable, fn: ToolFn, arguments: dict[str, Any]) -> None:
        """Queue ``fn(arguments)``; its result comes back from `poll` under ``key``."""
        with self._lock:
            index, self._next = self._next, self._next + 1
            self._calls[index] = (fn, (arguments,), True)
            self._keys[index] = (key, time.monotonic())
            self._todo.insert(0, index)
        os.write(self._wake_w, b"x")

    def poll(self, timeout_s: float = 0.0) -> list[tuple[Hashable, ToolResult]]:
        """The calls that finished, waiting up to ``timeout_s`` for the first one when none has."""
        if self.num_workers == 0:  # inline (debugging): no timeout, no containment
            while self._todo:
                index = self._todo.pop()
                fn, args, _ = self._calls[index]
                self._outcomes[index] = call_safely(fn, args, None, text=True)
            return self._collect()
        self.start()
        with self._lock:
            if timeout_s > 0 and not self._outcomes and self._keys:
                self._lock.wait_for(lambda: self._outcomes or not self._keys, timeout_s)
            return self._collect()

    def _serve(self) -> None:
        """The server thread: start workers, hand idle ones calls, wait for any worker's answer
        (or a submit), read it; until `close`."""
        while not self._stopping:
            with self._lock:
                self._hand_out(self._todo, self._calls, self._outcomes)
                fds = [fd for w in self._workers for fd in w.fds()]
                wait_s = self._wait_s() if self._workers else 1.0
                if self._outcomes:
                    self._lock.notify_all()  # calls that could not even be sent
            wait([*fds, self._wake_r], timeout=wait_s)
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            with self._lock:
                self._service(self._outcomes, self._todo)
                if self._outcomes:
                    self._lock.notify_all()

    def close(self) -> None:
        """Stop the server thread, then kill the workers (a later call starts both again)."""
        server, self._server = self._server, None
        if server is not None:
            self._stopping = True
            os.write(self._wake_w, b"x")
            server.join()
        super().close()

    def __del__(self) -> None:
        super().__del__()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _collect(self) -> list[tuple[Hashable, ToolResult]]:
        done, now = [], time.monotonic()
        for index, outcome in self._outcomes.items():
            key, start = self._keys.pop(index)
            del self._calls[index]
            text = outcome.text if outcome.status == "ok" else outcome.message
            done.append((key, ToolResult(outcome.status, text, now - start)))
        self._outcomes = {}
        return done
