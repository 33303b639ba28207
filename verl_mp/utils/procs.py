"""No process outlives its run: find a run's processes by its identity, and end them.

Every process a run starts inherits the driver's environment, and with it the run's
identity ``VERL_MP_RUN_ID`` (`verl_mp.utils.shm`): torchrun and its ranks, Ray's processes
and workers of a local cluster, reward workers, and what those start in turn (megatron's
checkpoint writer starts a multiprocessing manager; multiprocessing starts resource
trackers). A rank killed from outside leaves such grandchildren behind, re-parented to
init. The driver ends whatever still carries its run's identity once its ranks are done
(`reap_run`), and at start-up it ends the leftovers of runs whose driver is gone
(`reap_orphaned_runs`).

What may be signalled, and how a dead driver is told from a live one:

- **Only this user's processes in this pid namespace.** A process whose real or effective
  uid is another (root sees every user's processes), or that lives in another pid namespace
  (a container's processes seen from the host: their pids and run identities mean nothing
  here), is never touched.
- **A run is orphaned only when its driver's lock says so.** `begin_run` creates the run's
  lock file ``<tmp>/verl_mp-runs-<uid>/<run id>.lock`` (a `private_dir`) and holds an
  ``flock`` on it for the driver's life; the file also records the driver's pid, start time
  (clock ticks after boot), boot id and pid namespace. A run is orphaned when nobody holds
  its lock *and* that driver process (pid and start time, same boot) no longer runs. A run
  without a lock file here (started by ``launch/torchrun.sh``, by another machine sharing
  the host name, by an older version) is never judged orphaned.
- **Signals go through pidfds** (``os.pidfd_open`` + ``signal.pidfd_send_signal``, Linux
  >= 5.3): each process is pinned by a descriptor, and re-identified (owner, namespace, start
  time, run identity) before every signal; a pid the kernel has since given to another
  process cannot be hit, in the SIGKILL pass either. Without pidfds the process is
  re-identified just before ``os.kill`` (a warning says so: a pid reused in the instant
  between the check and the signal would be hit).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import select
import signal
import time
from dataclasses import dataclass

from verl_mp.utils.fs import UnsafePathError, check_private_dir, private_dir, read_private_file
from verl_mp.utils.shm import RUN_ID_ENV

logger = logging.getLogger(__name__)

RUN_LOCK_DIR_NAME = "verl_mp-runs"
"""``<tmp>/verl_mp-runs-<uid>``: the lock files of this user's runs (`begin_run`)."""


# -- what a process is ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process as found: its pid, its start time and its run identity. The pid alone
    names another process once this one exits and the kernel reuses the number."""

    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: clock ticks after boot when the process started."""
    run_id: str


def start_ticks(pid: int | str) -> int | None:
    """When process ``pid`` started (clock ticks after boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace(pid: int | str = "self") -> str | None:
    """The pid namespace of ``pid`` (``pid:[<inode>]``), None if it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _owned_by_me(pid: int | str) -> bool:
    """Real and effective uid of ``pid`` are this process's uid."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real, effective = (int(x) for x in line.split()[1:3])
                    return real == effective == os.getuid()
    except (OSError, ValueError):
        pass
    return False


def _run_id_of(pid: int | str) -> str | None:
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


def identify(pid: int | str) -> ProcessIdentity | None:
    """The identity of ``pid`` if it is one this process may signal: this user's (real and
    effective uid), in this pid namespace, running, carrying a run identity; else None."""
    if not _owned_by_me(pid) or pid_namespace(pid) != pid_namespace():
        return None
    run_id, ticks = _run_id_of(pid), start_ticks(pid)
    if not run_id or ticks is None or _is_zombie(pid):
        return None
    # read the start time again: a pid reused while we read the environment changes it
    return ProcessIdentity(int(pid), ticks, run_id) if start_ticks(pid) == ticks else None


def _is_zombie(pid: int | str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def find_processes(run_id: str | None = None) -> list[ProcessIdentity]:
    """This user's live processes of this namespace carrying a run identity (``run_id``
    only, if given); never this process."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        ident = identify(entry)
        if ident is not None and (run_id is None or ident.run_id == run_id):
            found.append(ident)
    return sorted(found, key=lambda p: p.pid)


def run_processes(run_id: str | None = None) -> dict[int, str]:
    """pid -> run id of `find_processes`."""
    return {p.pid: p.run_id for p in find_processes(run_id)}


# -- signalling ------------------------------------------------------------------------------------
_warned_no_pidfd = False


class _Target:
    """One process to end, pinned by a pidfd where the kernel has them."""

    def __init__(self, ident: ProcessIdentity):
        self.ident = ident
        self.fd: int | None = None
        self.gone = False
        try:
            self.fd = os.pidfd_open(ident.pid)
        except ProcessLookupError:
            self.gone = True
        except (AttributeError, OSError) as err:  # Linux < 5.3, or not Linux
            _warn_no_pidfd(err)
        # identified after the pidfd is open: if the pid was reused before, this sees the new
        # process (another start time) and drops it; after, the pidfd still names ours
        if not self.gone and identify(ident.pid) != ident:
            self.gone = True

    def exited(self) -> bool:
        if self.gone:
            return True
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            return bool(readable)
        return identify(self.ident.pid) != self.ident

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` if the process is still the one found; True if it was sent."""
        if self.exited() or identify(self.ident.pid) != self.ident:
            self.gone = True
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.ident.pid, sig)
            return True
        except ProcessLookupError:
            self.gone = True
            return False
        except PermissionError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _warn_no_pidfd(err: BaseException) -> None:
    global _warned_no_pidfd
    if not _warned_no_pidfd:
        _warned_no_pidfd = True
        logger.warning("pidfds are unavailable (%s; they need Linux >= 5.3): leftover processes are signalled "
                       "by pid, each re-identified (owner, start time, run) just before its signal", err)


def end_processes(found: list[ProcessIdentity], grace_s: float = 5.0) -> list[int]:
    """SIGTERM each process of ``found`` that is still the one found, then SIGKILL those
    still running after ``grace_s``; return the pids signalled."""
    targets = [_Target(p) for p in found]
    try:
        signalled = [t.ident.pid for t in targets if t.signal(signal.SIGTERM)]
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not all(t.exited() for t in targets):
            time.sleep(0.05)
        for t in targets:
            t.signal(signal.SIGKILL)
        return signalled
    finally:
        for t in targets:
            t.close()


def reap_run(run_id: str) -> list[int]:
    """End every process left of run ``run_id`` (call it once the run's ranks are done)."""
    found = find_processes(run_id)
    if not found:
        return []
    logger.info("ending %d process(es) left by this run: %s", len(found), [p.pid for p in found])
    return end_processes(found)


# -- the run's identity and its lock ---------------------------------------------------------------
_held_lock: tuple[str, int] | None = None
"""(run id, descriptor of its flocked lock file) of the run this process drives."""


def _lock_path(run_id: str) -> str:
    return os.path.join(private_dir(RUN_LOCK_DIR_NAME), f"{run_id}.lock")


def begin_run() -> str:
    """A fresh identity for a run this process drives, exported to every process it starts
    (never one inherited from whatever started this process: `reap_run` ends every process
    carrying it), and its lock, held until `end_run` or this process's end."""
    global _held_lock
    end_run()
    for _ in range(100):
        run_id = f"vmp{os.getpid()}x{secrets.token_hex(4)}"
        try:
            fd = os.open(_lock_path(run_id), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            break
        except FileExistsError:
            continue
    else:
        raise RuntimeError(f"could not create a run lock in {private_dir(RUN_LOCK_DIR_NAME)}")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
    os.write(fd, json.dumps({"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()), "boot_id": boot_id(),
                             "pid_namespace": pid_namespace()}).encode())
    _held_lock = (run_id, fd)
    os.environ[RUN_ID_ENV] = run_id
    return run_id


def end_run() -> None:
    """Release this process's run lock and remove the file (after `reap_run`)."""
    global _held_lock
    if _held_lock is None:
        return
    run_id, fd = _held_lock
    _held_lock = None
    for path in (_temp_record_path(run_id), _lock_path(run_id)):
        try:
            os.unlink(path)
        except OSError:
            pass
    os.close(fd)


RUN_TEMP_PREFIX = "verl_mp-"
"""The name prefix of a run's temporary directory (`verl_mp.trainer.run.RunTempDir`)."""


def _temp_record_path(run_id: str) -> str:
    return os.path.join(private_dir(RUN_LOCK_DIR_NAME), f"{run_id}.tmpdir")


def record_temp_dir(path: str) -> None:
    """Note the temporary directory of the run this process drives next to its lock, so that
    a later run removes it (`reap_orphaned_runs`) if this driver is killed before removing it."""
    if _held_lock is None:
        return
    fd = os.open(_temp_record_path(_held_lock[0]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.path.abspath(path))


def _remove_temp_dir_of(run_id: str) -> None:
    """The temporary directory a run whose driver is gone recorded (`record_temp_dir`), if it
    still is what was recorded: named ``verl_mp-*`` and a private directory of this user
    (`check_private_dir`: not a link, ours, writable by nobody else, as ``mkdtemp`` made it)."""
    import shutil

    record = _temp_record_path(run_id)
    try:
        path = os.fsdecode(read_private_file(record).strip())
    except OSError:
        return
    try:
        if os.path.basename(path).startswith(RUN_TEMP_PREFIX):
            check_private_dir(path)
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed %s, the temporary directory of run %s whose driver is gone", path, run_id)
    except (OSError, UnsafePathError):
        pass
    try:
        os.unlink(record)
    except OSError:
        pass


def orphaned(run_id: str) -> bool:
    """Whether run ``run_id`` was begun on this machine in this boot (its lock file is here)
    and its driver is gone: nobody holds the lock and the driver's process (pid and start
    time in this pid namespace, as recorded) does not run."""
    return _driver_state(run_id) == "gone"


def _driver_state(run_id: str) -> str:
    """``live`` (the lock is held), ``gone`` (see `orphaned`), ``earlier boot`` (a lock file
    left by a run before the last reboot) or ``unknown`` (no lock file here, unreadable, or
    of another pid namespace)."""
    if "/" in run_id or not run_id:
        return "unknown"
    path = _lock_path(run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "unknown"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return "live"
            raise
        try:
            info = json.loads(read_private_file(path))
        except (OSError, ValueError):
            return "unknown"  # being written by a driver that is starting
    finally:
        os.close(fd)
    if not isinstance(info, dict):
        return "unknown"
    if info.get("boot_id") != boot_id():
        return "earlier boot"
    if info.get("pid_namespace") != pid_namespace():
        return "unknown"
    pid, ticks = info.get("pid"), info.get("start_ticks")
    if not isinstance(pid, int):
        return "unknown"
    return "gone" if start_ticks(pid) != ticks or _is_zombie(pid) else "live"


def reap_orphaned_runs() -> list[int]:
    """End the processes of runs whose driver is gone (`orphaned`); remove their temporary
    directories and lock files."""
    by_run: dict[str, list[ProcessIdentity]] = {}
    for p in find_processes():
        by_run.setdefault(p.run_id, []).append(p)
    dead = {run_id for run_id in by_run if orphaned(run_id)}
    orphans = [p for run_id in sorted(dead) for p in by_run[run_id]]
    ended = []
    if orphans:
        logger.warning("ending %d process(es) left by runs whose driver is gone: %s",
                       len(orphans), [p.pid for p in orphans])
        ended = end_processes(orphans)
    _remove_stale_locks()
    return ended


def _remove_stale_locks() -> None:
    """Lock files (and temporary directories) of runs whose driver is gone and which no
    process carries any more."""
    directory = private_dir(RUN_LOCK_DIR_NAME)
    live = {p.run_id for p in find_processes()}
    for name in os.listdir(directory):
        run_id = name.removesuffix(".lock")
        if name.endswith(".lock") and run_id not in live and _driver_state(run_id) in ("gone", "earlier boot"):
            _remove_temp_dir_of(run_id)
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
