"""Runs reward-function calls with exception capture, a per-call timeout and containment.

Why processes: a Python thread cannot be stopped, so a hanging reward function in a thread
pool would block forever. Calls run in a few worker processes
(`verl_mp.reward.worker_proc`), each started with ``subprocess`` in a session of its own:

- **Contained**: a worker runs under ``setrlimit`` limits (address space, CPU time, open
  files; processes where that is meaningful, `WorkerLimits`), with an allowlisted
  environment (what Python, locale, libraries and certificates need: `worker_env`; anything
  else only through ``pass_env``) and without GPUs (``CUDA_VISIBLE_DEVICES=""``). Every process a reward function
  starts belongs to the worker's process group and is killed with it (``killpg``). A
  worker is replaced after ``max_calls_per_worker`` calls, so leaks do not build up.
- **Timeouts that cannot be cancelled silently**: in the worker, ``SIGALRM``
  (``ITIMER_REAL``) interrupts a call at ``timeout_s`` and the worker goes on. A call that
  returns late anyway (a library replaced or cancelled the alarm) still counts as a
  timeout. The parent is the watchdog: a call not answered within ``timeout_s +
  kill_grace_s`` after it started (C code that never returns to the interpreter, a
  cancelled alarm) gets its worker's process group killed and counts as a timeout.
- **Dead workers are seen at once**: the parent waits on each worker's pidfd, so a worker
  that dies (OOM killer, ``RLIMIT_CPU``, ``os._exit`` in a reward function) turns its call
  into an error right away and a new worker takes the remaining calls. A step therefore
  waits at most about one timeout for a bad call, never a batch-sized backstop.

Calls go to workers one at a time, so a dying worker loses only its own call.
``num_workers=0`` runs calls inline in the caller (exceptions captured, no timeout, no
containment): for debugging, or for functions that cannot be pickled.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from verl_mp.reward.call import Outcome, call_safely, normalize_result  # noqa: F401  (re-exported)
from verl_mp.reward.worker_proc import WorkerLimits, worker_env

logger = logging.getLogger(__name__)


class _Worker:
    """Parent-side handle of one worker process (its own session and process group)."""

    def __init__(self, env: dict[str, str], limits: WorkerLimits, timeout_s: float, start_timeout_s: float):
        ours, theirs = socket.socketpair()
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "verl_mp.reward.worker_proc", str(theirs.fileno())],
                env=env, pass_fds=(theirs.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL)
        self.conn = Connection(ours.detach())
        self.exit_fd = _pidfd(self.proc.pid)
        self.conn.send(("init", list(sys.path), limits, timeout_s))
        self.state = "starting"  # -> idle -> loading (call sent) -> running ("started") -> idle
        self.deadline = time.monotonic() + start_timeout_s
        self.index: int | None = None
        self.calls = 0

    def send(self, index: int, payload: bytes, load_timeout_s: float) -> None:
        self.conn.send_bytes(payload)
        self.state, self.index, self.deadline = "loading", index, time.monotonic() + load_timeout_s

    def fds(self) -> list:
        return [self.conn] if self.exit_fd is None else [self.conn, self.exit_fd]

    def has_exited(self) -> bool:
        return self.proc.poll() is not None

    def exit_reason(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = {"SIGKILL": " (the OOM killer, or reward.cpu_limit_s?)",
                    "SIGXCPU": " (its CPU time limit, reward.cpu_limit_s)"}
            return f"killed by {name}{hint.get(name, '')}"
        return f"exited with code {code}"

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (children it started included), reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.conn.close()
        if self.exit_fd is not None:
            os.close(self.exit_fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux >= 5.3); None elsewhere,
    where the executor polls at least once a second instead."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


_CANCELLED = Outcome("cancelled", message="not run: the step stopped (failure budget exceeded)")


class RewardExecutor:
    """Runs lists of ``(fn, args)`` calls; returns one Outcome per call, in order."""

    def __init__(
        self, num_workers: int = 4, timeout_s: float = 10.0, *, limits: WorkerLimits | None = None,
        max_calls_per_worker: int = 1000, pass_env: tuple[str, ...] | list[str] = (),
        kill_grace_s: float = 2.0, start_timeout_s: float = 60.0,
    ):
        """``kill_grace_s``: how long past ``timeout_s`` a call may take before its worker is
        killed. ``start_timeout_s``: for a worker to start, and for a call's function to be
        unpickled (its module imported) before the call's own clock starts."""
        if num_workers < 0 or timeout_s <= 0 or max_calls_per_worker < 1:
            raise ValueError(f"reward num_workers={num_workers} must be >= 0, timeout_s={timeout_s} "
                             f"> 0 and max_calls_per_worker={max_calls_per_worker} >= 1")
        if num_workers == 0:
            logger.warning("reward num_workers=0: reward functions run inline and "
                           "timeout_s=%s has no effect (exceptions are still caught)", timeout_s)
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self.limits = limits or WorkerLimits()
        self.max_calls_per_worker = max_calls_per_worker
        self.pass_env = tuple(pass_env)
        unset = [name for name in self.pass_env if not any(c in name for c in "*?[") and name not in os.environ]
        if unset and num_workers > 0:
            logger.warning("reward.pass_env names %s, unset in this environment: reward workers will not have "
                           "them either", unset)
        self.kill_grace_s, self.start_timeout_s = kill_grace_s, start_timeout_s
        self._workers: list[_Worker] = []

    def run(self, calls: list[tuple[Callable[..., Any], tuple]],
            stop_when: Callable[[list[Outcome | None]], bool] | None = None) -> list[Outcome]:
        """Run every call; failures, deaths and timeouts become Outcomes, never exceptions.

        ``stop_when(outcomes)`` (None: a call not finished yet) is asked as calls finish; when
        it answers True the calls still waiting or running are cancelled (their workers are
        killed) and come back as Outcome ``cancelled``: a failure budget that is already
        exceeded need not wait for the rest of the batch."""
        if self.num_workers == 0 or not calls:
            outcomes = []
            for fn, args in calls:
                cancelled = stop_when is not None and stop_when(outcomes + [None] * (len(calls) - len(outcomes)))
                outcomes.append(_CANCELLED if cancelled else call_safely(fn, args, None))
            return outcomes
        outcomes: list[Outcome | None] = [None] * len(calls)
        todo = list(range(len(calls)))[::-1]  # popped from the end: call order
        while todo or any(w.index is not None for w in self._workers):
            self._hand_out(todo, calls, outcomes)
            if self._workers:
                wait([fd for w in self._workers for fd in w.fds()], timeout=self._wait_s())
                self._service(outcomes, todo)
            if stop_when is not None and stop_when(outcomes):
                self.close()  # the calls in flight die with their workers
                todo.clear()
                return [_CANCELLED if o is None else o for o in outcomes]
        return outcomes  # type: ignore[return-value]

    def _hand_out(self, todo: list[int], calls, outcomes) -> None:
        """Start the workers the waiting calls need; give each idle worker the next call."""
        self._fill(todo)
        for worker in list(self._workers):
            if worker.state == "idle" and todo:
                self._dispatch(worker, todo, calls, outcomes)

    def _fill(self, todo: list[int]) -> None:
        busy = sum(w.index is not None for w in self._workers)
        while len(self._workers) < min(self.num_workers, busy + len(todo)):
            self._workers.append(_Worker(worker_env(os.environ, self.pass_env), self.limits,
                                         self.timeout_s, self.start_timeout_s))

    def _dispatch(self, worker: _Worker, todo: list[int], calls, outcomes) -> None:
        index = todo.pop()
        try:
            payload = pickle.dumps(calls[index])
        except Exception as err:  # noqa: BLE001  (an argument that cannot travel)
            outcomes[index] = Outcome("error", message=f"cannot send the call: {type(err).__name__}: {err}")
            return
        try:
            worker.send(index, payload, self.start_timeout_s)
        except OSError as err:  # the idle worker died since its last call: the call goes to another
            worker.index = None
            todo.append(index)
            self._lost(worker, outcomes, todo, f"{type(err).__name__}: {err}")

    def _wait_s(self) -> float:
        """Until the nearest deadline, at most 1 s (the poll where no pidfd is available)."""
        return min(1.0, max(0.0, min(w.deadline for w in self._workers) - time.monotonic()))

    def _service(self, outcomes: list, todo: list[int]) -> None:
        """Read every answer; replace workers that died, timed out or served their quota."""
        for worker in list(self._workers):
            message_error = self._read(worker, outcomes)
            if message_error is None and worker.state == "idle" and worker.calls >= self.max_calls_per_worker:
                self._retire(worker)
            elif message_error is not None or worker.has_exited():
                self._lost(worker, outcomes, todo, message_error)
            elif time.monotonic() >= worker.deadline and worker.state != "idle":
                self._timed_out(worker, outcomes, todo)

    def _read(self, worker: _Worker, outcomes: list) -> str | None:
        """Handle the worker's pending messages; the error if its connection broke."""
        try:
            while worker.conn.poll(0):
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.state, worker.deadline = "idle", math.inf
                elif message[0] == "started":
                    worker.state, worker.deadline = "running", time.monotonic() + self.timeout_s + self.kill_grace_s
                else:  # done
                    outcomes[worker.index] = Outcome(*message[1:])
                    worker.state, worker.index, worker.deadline = "idle", None, math.inf
                    worker.calls += 1
        except (EOFError, OSError) as err:
            return f"{type(err).__name__}: {err}"
        return None

    def _lost(self, worker: _Worker, outcomes: list, todo: list[int], broken: str | None) -> None:
        """The worker died (or its connection broke): its call errors, a new worker follows."""
        try:  # a dead worker's socket closes just before its exit status can be read
            worker.proc.wait(timeout=1.0)
            reason = worker.exit_reason()
        except subprocess.TimeoutExpired:
            reason = f"lost its connection ({broken})"
        reason = f"reward worker (pid {worker.proc.pid}) {reason}"
        worker.kill()  # also the children it left behind
        self._workers.remove(worker)
        if worker.index is not None:
            outcomes[worker.index] = Outcome("error", message=f"{reason} during this call")
        elif worker.state == "starting":
            self._fail_all(todo, outcomes, f"{reason} while starting")
        logger.warning("%s; the next call gets a new worker", reason)

    def _timed_out(self, worker: _Worker, outcomes: list, todo: list[int]) -> None:
        worker.kill()
        self._workers.remove(worker)
        if worker.state == "starting":
            self._fail_all(todo, outcomes, f"a reward worker did not start within {self.start_timeout_s}s")
            return
        where = "loading the function" if worker.state == "loading" else "the call"
        outcomes[worker.index] = Outcome("timeout", message=f"{where} ran past {self.timeout_s}s + "
                                                            f"{self.kill_grace_s}s grace; worker killed")
        logger.warning("reward call ran past its timeout without returning to Python; "
                       "killed its worker (pid %d) and its process group", worker.proc.pid)

    def _fail_all(self, todo: list[int], outcomes: list, reason: str) -> None:
        """Workers cannot start at all: every call still waiting fails with the reason."""
        logger.error("%s; the remaining %d reward calls fail", reason, len(todo))
        while todo:
            outcomes[todo.pop()] = Outcome("error", message=reason)

    def _retire(self, worker: _Worker) -> None:
        self._workers.remove(worker)
        worker.kill()  # its children go too; nothing of it is in flight

    def close(self) -> None:
        """Kill the worker processes and their process groups (a later ``run`` starts new ones)."""
        while self._workers:
            self._workers.pop().kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: nothing left to do)
            pass
