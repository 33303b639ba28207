"""No process outlives its run: find a run's processes by its identity, and end them.

Every process a run starts inherits the driver's environment, and with it the run's
identity ``VERL_MP_RUN_ID`` (`verl_mp.utils.shm`): torchrun and its ranks, Ray's processes
and workers of a local cluster, reward workers, and what those start in turn (megatron's
checkpoint writer starts a multiprocessing manager; multiprocessing starts resource
trackers). A rank killed from outside leaves such grandchildren behind, re-parented to
init. The driver ends whatever still carries its run's identity once its ranks are done,
and at start-up it ends the leftovers of runs whose driver, on this host, is gone
(``vmp<pid>h<host>x...``).
Only processes of this user that carry a verl_mp run identity are ever touched.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time

from verl_mp.utils.shm import RUN_ID_ENV, host_tag, pid_alive

logger = logging.getLogger(__name__)

_RUN_PID = re.compile(r"^vmp(\d+)h([0-9a-f]{4})x")


def _run_id_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    prefix = f"{RUN_ID_ENV}=".encode()
    for item in env:
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def run_processes(run_id: str | None = None) -> dict[int, str]:
    """pid -> run id of live processes carrying a run identity (``run_id`` only, if given);
    never this process."""
    found = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        rid = _run_id_of(entry)
        if rid and (run_id is None or rid == run_id):
            found[int(entry)] = rid
    return found


def end_processes(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is still alive after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.1)


def reap_run(run_id: str) -> list[int]:
    """End every process left of run ``run_id`` (call it once the run's ranks are done)."""
    pids = sorted(run_processes(run_id))
    if pids:
        logger.info("ending %d process(es) left by this run: %s", len(pids), pids)
        end_processes(pids)
    return pids


def reap_orphaned_runs() -> list[int]:
    """End the processes of runs whose driver (the pid in their identity) is gone."""
    host = host_tag()
    orphans = [pid for pid, rid in run_processes().items()
               if (m := _RUN_PID.match(rid)) and m.group(2) == host and not pid_alive(int(m.group(1)))]
    if orphans:
        logger.warning("ending %d process(es) left by runs whose driver is gone: %s", len(orphans), orphans)
        end_processes(orphans)
    return orphans
