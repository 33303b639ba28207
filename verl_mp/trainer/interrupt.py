"""Ctrl-C and SIGTERM: finish the step, save, stop every rank, then exit.

The first SIGINT or SIGTERM to `verl-mp train` asks the loop to stop after the step in
progress (it saves a checkpoint first, unless ``trainer.save_on_interrupt=false``); a
second SIGINT or SIGTERM stops at once (`StopNow`), keeping the last complete checkpoint. Under Ray the driver's
loop reads the request directly. Under torchrun the ranks run in a session of their own
(the terminal's Ctrl-C reaches only the driver); the driver writes ``<run dir>/.status/
stop`` and rank 0 reads it after every step and tells the others, so that every rank
stops after the same step.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

from verl_mp.trainer.status import STATUS_DIR
from verl_mp.utils.errors import StopNow

logger = logging.getLogger(__name__)

STOP_FILE = "stop"


class StopOnSignal:
    def __init__(self, on_request: Callable[[], None] | None = None):
        self.requested = False
        self.stop_now = ""
        """Set ("second SIGINT") when a second signal came: the run ends at once."""
        self.on_request = on_request or (lambda: None)

    def __enter__(self) -> StopOnSignal:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def reinstall(self) -> None:
        """Take the signals back from a library that installed its own handlers (``ray.init``
        installs a SIGTERM handler that exits the driver without the step's checkpoint)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            self.stop_now = f"second {signal.Signals(signum).name}"
            raise StopNow(self.stop_now)
        logger.warning("%s: stopping after the current step (saving a checkpoint first); Ctrl-C again to "
                       "stop at once", signal.Signals(signum).name)
        self.requested = True
        self.on_request()


def stop_path(run_dir: str) -> str:
    return os.path.join(run_dir, STATUS_DIR, STOP_FILE)


def request_stop(run_dir: str) -> None:
    os.makedirs(os.path.dirname(stop_path(run_dir)), exist_ok=True)
    open(stop_path(run_dir), "w").close()
