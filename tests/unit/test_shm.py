"""Shared-memory housekeeping (verl_mp/utils/shm.py) on real /dev/shm segments: a dead
process's segments are swept, a live process's never; a process releases its own."""

import os
import subprocess
import sys
import uuid
from multiprocessing import shared_memory

import pytest

from verl_mp.utils import shm

pytestmark = pytest.mark.unit

HOLDER = r"""
import sys, time
from multiprocessing import shared_memory
seg = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=4096)
print("ready", flush=True)
time.sleep(60)
"""


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(shm.SHM_DIR, name))


def test_sweep_keeps_mapped_segments_and_removes_orphans(tmp_path):
    live = f"vmp-test-{uuid.uuid4().hex[:8]}-cpushm_0"
    dead = f"vmp-test-{uuid.uuid4().hex[:8]}-cpushm_1"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, live], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        orphan = shared_memory.SharedMemory(name=dead, create=True, size=4096)
        orphan.close()  # nobody maps it any more: what a killed rank leaves
        from multiprocessing import resource_tracker

        resource_tracker.unregister(orphan._name, "shared_memory")  # as if our tracker died too
        removed = shm.sweep_stale()
        assert dead in removed and not _exists(dead)
        assert live not in removed and _exists(live)  # a live run's segment is never touched
    finally:
        holder.kill()
        holder.wait()
        shared_memory.SharedMemory(name=live).unlink()


def test_a_process_releases_what_it_recorded():
    name = f"vmp-test-{uuid.uuid4().hex[:8]}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
    from multiprocessing import resource_tracker

    resource_tracker.unregister(seg._name, "shared_memory")
    try:
        assert name in shm.record_segments()
        assert shm.release_segments() >= 1 and not _exists(name)
    finally:
        seg.close()


def test_run_ids_are_per_process_and_inherited(monkeypatch):
    monkeypatch.delenv(shm.RUN_ID_ENV, raising=False)
    first = shm.ensure_run_id()
    assert first.startswith(f"vmp{os.getpid()}x") and shm.ensure_run_id() == first
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{shm.RUN_ID_ENV}'])"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == first  # ranks started by this process share its identity
