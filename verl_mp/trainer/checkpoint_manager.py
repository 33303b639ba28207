"""Atomic, resumable checkpoint directories.

Layout under ``root``::

    global_step_<N>/                   one complete checkpoint (callers' files + meta.json)
    latest_checkpointed_iteration.txt  N of the newest commit (a convenience for users)
    .tmp_global_step_<N>/              staging dir of a save in progress
    .tmp_replaced_global_step_<N>/     the previous copy of step N while a re-save replaces it
    .verl_mp.lock                      held by rank 0 for the manager's life (`DirLock`)

A save is: ``staging_dir(N)`` -> every rank writes (and fsyncs) its parts -> ``commit(N,
meta)``. Commit writes ``meta.json`` last, fsyncs the tree, and publishes it as
``global_step_<N>`` with `verl_mp.utils.fs.publish_dir`: a previous copy of step N is moved
aside, the new one renamed in, and only then the old one deleted. A crash at any point
leaves the old set of complete checkpoints, or the old set plus the new one. ``latest()``
scans the directories (not the txt file) and counts only ``global_step_<N>`` dirs holding a
``meta.json``. Directories being removed are first renamed to ``.tmp_*`` so a crash
mid-delete never leaves a half-deleted dir that looks complete.

At start, rank 0 takes the directory's lock (a second run on the same directory is refused
while the first holds it; a dead holder does not block) and then recovers: a staging dir
holding ``meta.json`` was complete when the crash came and is published; a replaced copy is
deleted once its step is back in place (restored if not); other ``.tmp_*`` dirs are partial
and removed. Checkpoint dirs are created with mode 0700: weights and optimizer state stay
private to the user (``chmod`` to share them).

The root must be one filesystem shared by all ranks (renames are not atomic across
filesystems). Only rank 0 touches the directory structure; ``world_barrier`` (e.g.
``torch.distributed.barrier``) orders it against the other ranks' writes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from typing import Any

from verl_mp.utils.fs import DirLock, fsync_tree, publish_dir, recover_publish, write_file_durably

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "global_step_"
STAGING_PREFIX = ".tmp_"
REPLACED_PREFIX = f"{STAGING_PREFIX}replaced_"
META_FILENAME = "meta.json"
LATEST_FILENAME = "latest_checkpointed_iteration.txt"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def checkpoint_step(path: str) -> int | None:
    """N for a path whose last component is ``global_step_<N>``; None otherwise."""
    match = _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def is_complete(path: str) -> bool:
    """True if ``path`` is a directory holding a readable ``meta.json``."""
    meta_path = os.path.join(path, META_FILENAME)
    if not os.path.isfile(meta_path):
        return False
    try:
        with open(meta_path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        logger.warning("ignoring checkpoint %s: unreadable %s (%s)", path, META_FILENAME, exc)
        return False
    return True


class CheckpointManager:
    """Stages, commits, prunes and finds ``global_step_<N>`` checkpoint directories."""

    def __init__(
        self,
        root: str,
        keep_last: int | None = None,
        rank: int = 0,
        world_barrier: Callable[[], None] | None = None,
    ):
        """``keep_last``: complete checkpoints to keep (None keeps all). Rank 0 creates
        ``root``, locks it (`DirLockedError` if another process holds it) and recovers what
        a crashed run left (see the module docstring)."""
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last={keep_last} must be None (keep all) or >= 1")
        self.root = os.path.abspath(root)
        self.keep_last = keep_last
        self.rank = rank
        self._barrier = world_barrier or (lambda: None)
        self._lock = DirLock(self.root, purpose="a checkpoint manager")
        if rank == 0:
            os.makedirs(self.root, exist_ok=True)
            self._lock.acquire()
            self._recover()

    def close(self) -> None:
        """Release the directory lock (also released when the process exits)."""
        self._lock.release()

    def checkpoint_dir(self, step: int) -> str:
        """``<root>/global_step_<step>``."""
        return os.path.join(self.root, f"{CHECKPOINT_PREFIX}{step}")

    def staging_path(self, step: int) -> str:
        """``<root>/.tmp_global_step_<step>`` (path only; see ``staging_dir``)."""
        return os.path.join(self.root, f"{STAGING_PREFIX}{CHECKPOINT_PREFIX}{step}")

    def staging_dir(self, step: int) -> str:
        """A fresh, empty staging dir for ``step`` where all ranks write their parts.

        Collective: rank 0 (re)creates it, then all ranks pass the barrier.
        """
        path = self.staging_path(step)
        if self.rank == 0:
            if os.path.exists(path):
                logger.warning("removing stale staging dir %s", path)
                shutil.rmtree(path)
            os.makedirs(path, mode=0o700)
        self._barrier()
        return path

    def commit(self, step: int, meta: dict[str, Any] | None = None) -> str:
        """Publish the staging dir of ``step`` as ``global_step_<step>``; returns its path.

        Collective: a barrier (all parts written), then rank 0 writes meta.json, fsyncs,
        renames, updates the txt file and prunes, then a second barrier.
        """
        meta = dict(meta or {})
        for reserved in ("step", "time"):
            if reserved in meta:
                raise ValueError(f"meta key {reserved!r} is reserved (set by commit)")
        self._barrier()
        final = self.checkpoint_dir(step)
        if self.rank == 0:
            self._publish(step, {"step": step, "time": time.time(), **meta})
            self._prune(step)
        self._barrier()
        return final

    def latest(self) -> tuple[int, str] | None:
        """(step, path) of the newest complete checkpoint, or None if there is none."""
        complete = [(step, path) for step, path in self._checkpoints() if is_complete(path)]
        return max(complete) if complete else None

    def short_of_space(self) -> str | None:
        """Why the file system of the checkpoints is too full for another one, or None: less
        free space than the newest complete checkpoint takes (less than 16 MiB when there is
        none). For writers whose error loses the ``ENOSPC`` (torch's zip writer reports
        ``unexpected pos``; other ranks of a DCP save get an empty ``CheckpointException``)."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        latest = self.latest()
        needed = _tree_bytes(latest[1]) if latest else 16 << 20
        if free >= needed:
            return None
        what = f"the newest checkpoint's {_mib(needed)}" if latest else _mib(needed)
        return f"{_mib(free)} free there, less than {what}"

    def resolve_resume(self, mode: str) -> tuple[int, str] | None:
        """Where to resume from: "disable" -> None, "auto" -> ``latest()``, or a path.

        A path must be a complete ``global_step_<N>`` directory, else ``ValueError``.
        """
        if mode == "disable":
            return None
        if mode == "auto":
            return self.latest()
        path = os.path.abspath(os.path.expanduser(mode))
        step = checkpoint_step(path)
        if step is None or not os.path.isdir(path) or not is_complete(path):
            raise ValueError(
                f"trainer.resume_mode={mode!r}: {path} is not a complete checkpoint "
                f"(a {CHECKPOINT_PREFIX}<N> directory holding {META_FILENAME}); "
                "use 'auto', 'disable' or the path of such a directory"
            )
        newest = self.latest()
        if newest is not None and newest[0] > step:
            logger.warning(
                "resuming from %s although %s is newer; later saves go next to it",
                path, newest[1],
            )
        return step, path

    def _publish(self, step: int, meta: dict[str, Any]) -> None:
        """Rank 0: meta.json, fsync, publish staging -> final, update the txt file."""
        staging = self.staging_path(step)
        if not os.path.isdir(staging):
            raise FileNotFoundError(f"commit({step}) without staging_dir({step}): no {staging}")
        with open(os.path.join(staging, META_FILENAME), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        fsync_tree(staging)
        self._swap_in(step)
        logger.info("saved checkpoint %s", self.checkpoint_dir(step))

    def _swap_in(self, step: int) -> None:
        """Publish the complete staging dir of ``step``; a previous copy goes only afterwards."""
        publish_dir(self.staging_path(step), self.checkpoint_dir(step), self._replaced_path(step))
        write_file_durably(os.path.join(self.root, LATEST_FILENAME), f"{step}\n")

    def _replaced_path(self, step: int) -> str:
        return os.path.join(self.root, f"{REPLACED_PREFIX}{CHECKPOINT_PREFIX}{step}")

    def _prune(self, just_saved: int) -> None:
        """Rank 0: keep ``keep_last`` checkpoints up to ``just_saved`` (which always stays).

        Only complete checkpoints count and are removed; ones with a larger step (left
        by a run resumed from an earlier one) are not touched.
        """
        if self.keep_last is None:
            return
        older = sorted(
            (step, path)
            for step, path in self._checkpoints()
            if step < just_saved and is_complete(path)
        )
        num_to_delete = max(0, len(older) - (self.keep_last - 1))
        for _step, path in older[:num_to_delete]:
            logger.info("removing old checkpoint %s (keep_last=%d)", path, self.keep_last)
            self._delete(path)

    def _delete(self, path: str) -> None:
        """Rename to a ``.tmp_*`` name first (atomic), then remove the tree."""
        doomed = os.path.join(self.root, f"{STAGING_PREFIX}deleting_{os.path.basename(path)}")
        if os.path.exists(doomed):
            shutil.rmtree(doomed)
        os.replace(path, doomed)
        shutil.rmtree(doomed)

    def _checkpoints(self) -> list[tuple[int, str]]:
        """(step, path) of every ``global_step_<N>`` dir under root, complete or not."""
        if not os.path.isdir(self.root):
            return []
        found = []
        for entry in os.scandir(self.root):
            step = checkpoint_step(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append((step, entry.path))
        return found

    def _recover(self) -> None:
        """Rank 0 at start-up, holding the lock: finish or undo what a crashed run left."""
        steps = set()
        for entry in os.scandir(self.root):
            for prefix in (STAGING_PREFIX, REPLACED_PREFIX):
                step = checkpoint_step(entry.name.removeprefix(prefix)) if entry.name.startswith(prefix) else None
                if step is not None:
                    steps.add(step)
        published = False
        for step in sorted(steps):
            staging = self.staging_path(step)
            done = recover_publish(self.checkpoint_dir(step), self._replaced_path(step),
                                   staging_complete=is_complete(staging), staging=staging)
            if done:
                logger.warning("checkpoint step %d: %s (left by an interrupted save)", step, done)
                published = published or done == "published"
        newest = self.latest() if published else None
        if newest is not None:
            write_file_durably(os.path.join(self.root, LATEST_FILENAME), f"{newest[0]}\n")
        for entry in os.scandir(self.root):
            if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
                logger.warning("removing stale checkpoint staging dir %s", entry.path)
                shutil.rmtree(entry.path)


def _tree_bytes(root: str) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files)


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.1f} MiB"
