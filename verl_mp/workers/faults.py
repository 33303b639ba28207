"""Deterministic fault injection, for the tests that prove failures are handled.

``VERL_MP_FAULT="<call>:<n>:<rank>:<kind>"`` makes rank ``<rank>`` of every worker group
fail in its ``<n>``-th call of ``<call>`` (a `RankWorker` method: generate, forward,
update, sync_weights), before doing the work. ``<kind>``: ``raise`` (a Python exception)
or ``kill`` (SIGKILL of the process: what the out-of-memory killer does). Unset: nothing
happens (one dictionary lookup per call).
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "VERL_MP_FAULT"


class InjectedFault(RuntimeError):
    pass


class FaultInjector:
    def __init__(self, rank: int):
        spec = os.environ.get(FAULT_ENV, "")
        self.rank, self.calls = rank, {}
        self.target = None
        if spec:
            call, n, fault_rank, kind = spec.split(":")
            if kind not in ("raise", "kill"):
                raise ValueError(f"{FAULT_ENV}={spec!r}: kind must be raise or kill")
            self.target = (call, int(n), int(fault_rank), kind)

    def check(self, call: str) -> None:
        if self.target is None:
            return
        self.calls[call] = self.calls.get(call, 0) + 1
        name, n, rank, kind = self.target
        if (call, self.calls[call], self.rank) != (name, n, rank):
            return
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault ({FAULT_ENV}) in {call} call {n} on rank {rank}")
