"""Crash-safe file system steps: fsync, publishing a staged directory, a lock per directory.

`publish_dir` replaces a directory with a complete staged tree in two renames
(``final -> old``, ``staging -> final``), so ``final`` is always either the whole old tree,
the whole new tree, or (for the instant between the renames, and after a crash there)
absent while the old tree waits at ``old``: never a mix of both. `recover_publish` finishes or
undoes an interrupted publication. `DirLock` is an exclusive ``flock`` on a file in a
directory: held for a process's life, released by the kernel when the holder dies.
`private_dir` is a per-user directory under the temp directory that nobody else can have
planted; `write_private_file` writes into it without following links.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time


def fsync_path(path: str) -> None:
    """fsync one file or directory (directories: makes renames/creates in them durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (bottom-up), then ``root`` itself."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fsync_path(path)
        fsync_path(dirpath)


def write_file_durably(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temp file, fsync, then ``os.replace``."""
    tmp_path = f"{path}.tmp.{os.getpid()}"
    with open(tmp_path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
    fsync_path(os.path.dirname(path) or ".")


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""No space, over quota, past the file size limit (RLIMIT_FSIZE): nothing more fits."""


def disk_full_error(err: BaseException) -> OSError | None:
    """The OSError of a full disk (`DISK_FULL_ERRNOS`) that caused ``err``, if one did: ``err``
    itself, its causes and contexts, a Ray task error's ``cause`` (the worker's exception) or
    the per-rank ``failures`` of torch's ``CheckpointException`` (megatron's DCP writer, whose
    writer processes' errors come back as ``RuntimeError("Worker failure: ...")`` caused by
    them)."""
    todo, seen = [err], set()
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        todo += [exc.__cause__, exc.__context__, getattr(exc, "cause", None)]
        failures = getattr(exc, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None


def publish_dir(staging: str, final: str, old: str) -> None:
    """Replace ``final`` by the complete, fsynced tree ``staging`` (same file system).

    ``old`` is where the previous ``final`` waits between the two renames; it is deleted
    once the new tree is in place. Call `recover_publish` with the same paths after a crash.
    """
    parent = os.path.dirname(os.path.abspath(final))
    if os.path.lexists(final):
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(staging, final)
        fsync_path(parent)
        shutil.rmtree(old)
    else:
        os.replace(staging, final)
    fsync_path(parent)


def recover_publish(final: str, old: str, staging_complete: bool, staging: str) -> str | None:
    """Finish a `publish_dir` a crash interrupted; returns what was done (None: nothing).

    A complete ``staging`` is published (over ``final`` if that exists); then ``old`` is
    deleted if ``final`` exists, or renamed back to ``final`` if not.
    """
    done = None
    if staging_complete and os.path.isdir(staging):
        publish_dir(staging, final, old)
        done = "published"
    if os.path.lexists(old):
        if os.path.lexists(final):
            shutil.rmtree(old)
            done = done or "removed the replaced copy"
        else:
            os.replace(old, final)
            fsync_path(os.path.dirname(os.path.abspath(final)))
            done = "restored the previous copy"
    return done


class DirLockedError(ValueError):
    """Another process holds the directory's lock (a ValueError: a user's setting to fix)."""


class DirLock:
    """An exclusive ``flock`` on ``<directory>/<name>``, re-entrant within one process.

    A second process is refused with `DirLockedError` naming the holder (pid, host, start
    time, as the holder wrote them into the file). The kernel drops the lock when the holder
    exits or is killed, so a dead run never blocks the next one. On a shared file system the
    lock is as good as its ``flock`` support (local file systems, NFSv4, Lustre with
    ``-o flock``).
    """

    _held: dict[str, list] = {}  # path -> [fd, count]; one lock per process and path
    _guard = threading.Lock()

    def __init__(self, directory: str, name: str = ".verl_mp.lock", purpose: str = "a run"):
        self.path = os.path.join(os.path.realpath(directory), name)
        self.purpose = purpose
        self.locked = False

    def acquire(self) -> DirLock:
        with self._guard:
            entry = self._held.get(self.path)
            if entry is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                entry = [self._lock_file(), 0]
                self._held[self.path] = entry
            entry[1] += 1
        self.locked = True
        return self

    def _lock_file(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DirLockedError(
                f"{os.path.dirname(self.path)} is in use by {holder}; two runs must not share "
                f"it (they would overwrite each other's files). Stop that run, or give this "
                f"one another directory (trainer.default_local_dir)") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        return fd

    def release(self) -> None:
        if not self.locked:
            return
        self.locked = False
        with self._guard:
            entry = self._held[self.path]
            entry[1] -= 1
            if entry[1] == 0:
                del self._held[self.path]
                os.close(entry[0])  # closing the descriptor drops the flock

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"{info.get('purpose', 'a run')} (pid {info.get('pid')} on {info.get('host')}, "
                f"since {info.get('since')})")
    except (OSError, ValueError):
        return "another process"


# -- per-user directories under the shared temp directory --------------------------------------
class UnsafePathError(ValueError):
    """A per-user path in a shared directory that another user could have planted or can
    change (a ValueError: the message names the path and the fix)."""


SHARED_TMPDIR_ENV = "VERL_MP_SHARED_TMPDIR"
"""The temp dir of the machine's runs, where `private_dir` puts this user's shared records
(run locks, shared-memory records): a run's processes get a ``TMPDIR`` of the run's own
(`verl_mp.trainer.run.RunTempDir`), and keep finding the shared records through this."""


def private_dir(name: str) -> str:
    """``<tmp>/<name>-<uid>`` (`SHARED_TMPDIR_ENV`, else ``tempfile.gettempdir()``: ``TMPDIR`` or ``/tmp``), created
    mode 0700 when missing.

    ``/tmp`` is shared: another user can create that name first, as a directory of theirs
    or as a symbolic link to one of this user's directories, and so read or redirect what
    is written there. An existing path is used only if it is a real directory (not a link)
    owned by this user and writable by nobody else; anything else raises `UnsafePathError`
    naming the path and the fix. Nobody else can rename or remove a directory of ours in a
    sticky ``/tmp``, so the path stays what was checked.
    """
    path = os.path.join(os.environ.get(SHARED_TMPDIR_ENV) or tempfile.gettempdir(), f"{name}-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """Raise `UnsafePathError` unless ``path`` is a directory (not a symbolic link) owned by
    this user and not writable by group or others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        return
    raise UnsafePathError(
        f"{path} {problem}: verl_mp keeps this user's private records there, and another user may "
        f"have made it to read or redirect them. Fix: check what it is and remove it (rm -r {path}), "
        "or set TMPDIR to a directory of your own")


def write_private_file(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` to ``directory/name`` (mode 0600) atomically, never through a link: the
    temp file is created with ``O_EXCL | O_NOFOLLOW`` (a planted file or link there is an
    error, not a redirect) and renamed over ``name`` (a rename replaces a link, it does not
    follow it)."""
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.unlink(tmp)  # our own leftover of a killed write (pids are unique among the living)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read_private_file(path: str) -> bytes:
    """The bytes of ``path``, refusing to follow a symbolic link (OSError ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
