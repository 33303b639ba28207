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
    assert first.startswith(f"vmp{os.getpid()}h{shm.host_tag()}x") and shm.ensure_run_id() == first
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{shm.RUN_ID_ENV}'])"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == first  # ranks started by this process share its identity


ORPHAN = r"""
import os, subprocess, sys, time
# a "rank" that starts a grandchild and then dies, as a SIGKILLed rank leaves its children
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
"""


def test_processes_of_a_run_are_found_by_identity_and_ended():
    from verl_mp.utils import procs

    def orphan(run_id):  # the pid of a grandchild whose parent exited, carrying ``run_id``
        env = dict(os.environ, **{shm.RUN_ID_ENV: run_id})
        out = subprocess.run([sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True, check=True)
        return int(out.stdout.strip())

    dead_driver = f"vmp{2**22 + 12345}h{shm.host_tag()}x{uuid.uuid4().hex[:8]}"  # above pid_max: no such pid
    other_host = f"vmp{2**22 + 12345}h{'0000' if shm.host_tag() != '0000' else '0001'}x{uuid.uuid4().hex[:8]}"
    mine, foreign = orphan(dead_driver), orphan(other_host)
    try:
        assert procs.run_processes(dead_driver) == {mine: dead_driver}
        ended = procs.reap_orphaned_runs()
        assert mine in ended and not shm.pid_alive(mine)  # its driver on this host is gone: ended
        assert foreign not in ended and shm.pid_alive(foreign)  # a pid of another host says nothing here
        assert procs.reap_run(other_host) == [foreign] and not shm.pid_alive(foreign)
    finally:
        procs.end_processes([mine, foreign], grace_s=0.5)
