"""The orphan reaper (verl_mp/utils/procs.py) on real processes: it ends the leftovers of a
run whose driver was killed, and never signals a process of another user, of another pid
namespace, of a run whose driver lives or that it cannot place, or a process that took the
pid of one it found.

Before this change a run was named by a 16-bit hash of the host name plus the driver's pid:
a dead pid meant a dead driver (another container with the same host name, a reused pid),
the owner was never checked (root signalled every user's processes carrying an identity),
and the SIGKILL pass signalled bare pids again."""

import json
import os
import signal
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from verl_mp.utils import procs, shm

pytestmark = pytest.mark.unit

DRIVER = r"""
import os, subprocess, sys, time
from verl_mp.utils import procs
run_id = procs.begin_run()
kids = [subprocess.Popen(["sleep", "120"])]  # a rank's leftover: carries the run identity
if len(sys.argv) > 1:  # the same identity in a process of another user (root only)
    kids.append(subprocess.Popen(["sleep", "120"], user=int(sys.argv[1]), group=int(sys.argv[1])))
print(json.dumps({"run_id": run_id, "pids": [k.pid for k in kids]}), flush=True)
time.sleep(120)
""".replace("import os,", "import json, os,")


class Driver:
    """A process that begins a run (holding its lock) and leaves children carrying it."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, args)], stdout=subprocess.PIPE,
                                     text=True)
        info = json.loads(self.proc.stdout.readline())
        self.run_id, self.pids = info["run_id"], info["pids"]

    def kill(self):  # as `kill -9 <driver>` would: its children live on, re-parented
        self.proc.kill()
        self.proc.wait()

    def cleanup(self):
        if self.proc.poll() is None:
            self.kill()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdout.close()


def _alive(pid: int) -> bool:
    return shm.pid_alive(pid)


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_killed_drivers_leftovers_are_ended_a_live_ones_never():
    dead, live = Driver(), Driver()
    try:
        dead.kill()
        assert procs.orphaned(dead.run_id) and not procs.orphaned(live.run_id)
        ended = procs.reap_orphaned_runs()
        assert dead.pids[0] in ended and _wait_gone(dead.pids[0])
        assert live.pids[0] not in ended and _alive(live.pids[0])  # its driver holds the lock
        assert not os.path.exists(procs._lock_path(dead.run_id))  # nothing of it is left
    finally:
        dead.cleanup()
        live.cleanup()


TEMP_DRIVER = r"""
import json, time
from verl_mp.trainer.run import RunTempDir
from verl_mp.utils import procs
procs.begin_run()
with RunTempDir() as tmp:
    open(tmp + "/socket-or-log", "w").close()  # what torchrun, multiprocessing or Ray put there
    print(json.dumps({"tmp": tmp}), flush=True)
    time.sleep(120)
"""


def test_a_killed_drivers_temp_dir_is_removed_by_the_next_run_a_live_ones_never():
    """The run's own TMPDIR (`RunTempDir`) is removed by its driver at the end; a driver
    killed with SIGKILL cannot, so the next run's start-up (`reap_orphaned_runs`) does."""
    drivers = [subprocess.Popen([sys.executable, "-c", TEMP_DRIVER], stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        dead_tmp, live_tmp = (json.loads(d.stdout.readline())["tmp"] for d in drivers)
        assert os.path.basename(dead_tmp).startswith(procs.RUN_TEMP_PREFIX)
        drivers[0].kill()
        drivers[0].wait()
        assert os.path.isdir(dead_tmp)  # nobody removed it: the driver died at once
        procs.reap_orphaned_runs()
        assert not os.path.exists(dead_tmp)
        assert os.path.isfile(os.path.join(live_tmp, "socket-or-log"))  # a live run's stays
    finally:
        for d in drivers:
            d.kill()
            d.wait()
            d.stdout.close()


def test_a_run_without_a_lock_here_is_never_judged_orphaned():
    """A run of another machine with the same host name, of launch/torchrun.sh, or of an
    older version: its driver's pid means nothing here."""
    run_id = shm.new_run_id().replace(f"vmp{os.getpid()}", "vmp4194000")  # above pid_max: no such pid
    child = subprocess.Popen(["sleep", "120"], env={**os.environ, shm.RUN_ID_ENV: run_id})
    try:
        assert procs.run_processes(run_id) == {child.pid: run_id}
        assert not procs.orphaned(run_id)
        assert child.pid not in procs.reap_orphaned_runs() and _alive(child.pid)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="starting a process of another user needs root")
def test_a_process_of_another_user_is_never_signalled():
    driver = Driver(65534)  # nobody
    mine, nobodys = driver.pids
    try:
        driver.kill()
        ended = procs.reap_orphaned_runs()
        assert mine in ended and _wait_gone(mine)  # the run's own leftover goes...
        assert nobodys not in ended and _alive(nobodys)  # ...another user's never, even for root
        assert procs.reap_run(driver.run_id) == [] and _alive(nobodys)
        assert procs.identify(nobodys) is None
    finally:
        driver.cleanup()


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"), reason="a pid namespace needs root")
def test_a_process_of_another_pid_namespace_is_never_signalled():
    """A container's processes, seen from the host: their pids and run identities are the
    container's own."""
    driver = Driver()
    env = {**os.environ, shm.RUN_ID_ENV: driver.run_id}
    boxed = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "120"], env=env,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        inner = []
        while not inner and time.monotonic() < deadline:  # unshare's forked child: the namespace's pid 1
            inner = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(p) == boxed.pid]
            time.sleep(0.05)
        assert inner and procs.pid_namespace(inner[0]) != procs.pid_namespace()
        driver.kill()
        ended = procs.reap_orphaned_runs()
        assert driver.pids[0] in ended and inner[0] not in ended and _alive(inner[0])
    finally:
        os.killpg(boxed.pid, signal.SIGKILL)
        boxed.wait()
        driver.cleanup()


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


REUSE = r"""
import os, signal, subprocess, sys, time
from verl_mp.utils import procs, shm
if sys.argv[1] == "no-pidfd":
    del os.pidfd_open  # an older kernel: signalled by pid, re-identified first
env = {**os.environ, shm.RUN_ID_ENV: "vmp1x00000000"}
first = subprocess.Popen(["sleep", "120"], env=env)
time.sleep(0.2)  # exec'd: its environment is the run's
found = procs.find_processes("vmp1x00000000")
assert [p.pid for p in found] == [first.pid], found
first.kill()
first.wait()  # its pid is free
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(first.pid - 1))
second = subprocess.Popen(["sleep", "120"], env=env)  # same pid, same run identity, another process
assert second.pid == first.pid, (second.pid, first.pid)
time.sleep(0.2)
assert procs.end_processes(found, grace_s=0.5) == []
assert second.poll() is None, "the process that reused the pid was signalled"
assert procs.reap_run("vmp1x00000000") == [second.pid]  # found afresh, it is ended
second.wait(timeout=10)
print("ok", flush=True)
"""


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"), reason="choosing a pid needs root")
@pytest.mark.parametrize("mode", ["pidfd", "no-pidfd"])
def test_a_reused_pid_is_never_signalled(mode):
    """In a pid namespace of its own (no other process takes pids there), the found process
    exits and an unrelated one gets its pid (``ns_last_pid``): signalling what was found
    must not reach it."""
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                           textwrap.dedent(REUSE), mode], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_lock_files_of_gone_drivers_and_earlier_boots_are_removed():
    from verl_mp.utils.fs import private_dir

    directory = private_dir(procs.RUN_LOCK_DIR_NAME)
    earlier = os.path.join(directory, "vmp1x0000beef.lock")
    with open(earlier, "w") as f:
        json.dump({"pid": 1, "start_ticks": 1, "boot_id": "an-earlier-boot", "pid_namespace": procs.pid_namespace()}, f)
    driver = Driver()
    try:
        driver.kill()
        procs.reap_orphaned_runs()
        assert not os.path.exists(earlier) and not os.path.exists(procs._lock_path(driver.run_id))
    finally:
        driver.cleanup()
