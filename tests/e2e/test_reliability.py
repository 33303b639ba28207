"""Runs do not break each other and failures are reported, bounded and recoverable.

- A SIGKILL of `verl-mp train` stops every process of the run; the next runs start fine,
  two of them side by side on this machine, with the metrics a run has alone.
- A rank that raises, or that is SIGKILLed during generation, stops the run within a
  bounded time with one message naming the rank and the phase; no process of the run is
  left, no shared-memory segment either; ``resume_mode=auto`` then continues exactly.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e

VOLATILE = ("timing/", "perf/", "rollout/sync_gbps")
RUN = ["--config-name", "grpo", "actor.megatron.tensor_model_parallel_size=2",
       "rollout.tensor_model_parallel_size=2", "trainer.save_freq=1", "trainer.test_freq=0"]


def _args(inputs, out, launcher="torchrun", steps=2):
    return [*RUN, *base_overrides(inputs, out, launcher, steps=steps)]


def _cli(args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "verl_mp", "train", *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _steps(out):
    rows = {}
    for r in read_jsonl(str(out / "metrics.jsonl")):
        rows[r["step"]] = {k: v for k, v in r.items() if not k.startswith(VOLATILE)}
    return rows


def _processes_of(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "cpushm" in n or n.startswith("psm_")}


def _gone(text: str, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while _processes_of(text) and time.time() < deadline:
        time.sleep(0.5)
    return not _processes_of(text)


def test_killed_run_then_two_runs_side_by_side(tiny_run_inputs, tmp_path):
    before = _segments()
    killed = tmp_path / "killed"
    proc = _cli(_args(tiny_run_inputs, killed))
    deadline = time.time() + 400
    while 1 not in (_steps(killed) if (killed / "metrics.jsonl").exists() else {}):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "the run did not reach its first checkpoint"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # the driver only, as `kill -9 <verl-mp pid>` would
    proc.wait()
    assert _gone(str(killed), 60), f"processes of the killed run survived: {_processes_of(str(killed))}"

    a, b = tmp_path / "a", tmp_path / "b"
    runs = [_cli(_args(tiny_run_inputs, a)), _cli(_args(tiny_run_inputs, b))]
    for p in runs:
        assert p.wait(timeout=900) == 0, p.stderr.read()[-3000:]
    alone, first, second = _steps(killed), _steps(a), _steps(b)
    assert first == second and first[1] == alone[1]  # side by side = alone, bit for bit
    assert not _processes_of(str(a)) and not _processes_of(str(b))
    assert _segments() <= before, f"shared memory left behind: {_segments() - before}"


@pytest.mark.parametrize("launcher,fault,message", [
    ("torchrun", "update:1:1:raise", r"rank 1 failed in phase update of step 1: InjectedFault"),
    ("ray", "forward:2:1:raise", r"actor_rollout_ref rank 1 failed in forward: .*InjectedFault.*phase forward of step 2"),
])
def test_a_failing_rank_is_named_with_its_phase(tiny_run_inputs, tmp_path, launcher, fault, message):
    import re

    before = _segments()
    out = tmp_path / launcher
    proc = _cli(_args(tiny_run_inputs, out, launcher=launcher), env={"VERL_MP_FAULT": fault})
    assert proc.wait(timeout=600) == 1
    last = proc.stderr.read().strip().splitlines()[-1]
    assert last.startswith("verl-mp train: run failed: ") and re.search(message, last), last
    assert _gone(str(out), 30) and _segments() <= before


def test_rank_killed_during_generation_then_exact_resume(tiny_run_inputs, tmp_path):
    before = _segments()
    full, cut = tmp_path / "full", tmp_path / "cut"
    run_cli(_args(tiny_run_inputs, full))
    started = time.time()
    proc = _cli(_args(tiny_run_inputs, cut), env={"VERL_MP_FAULT": "generate:2:1:kill"})
    assert proc.wait(timeout=600) == 1
    last = proc.stderr.read().strip().splitlines()[-1]
    assert "rank 1 died in phase generate of step 2 without a Python error (SIGKILL" in last, last
    assert _gone(str(cut), 30), "ranks survived"
    assert time.time() - started < 300 and _segments() <= before
    run_cli(_args(tiny_run_inputs, cut))  # resume_mode=auto: from step 1's checkpoint
    assert _steps(cut)[2] == _steps(full)[2]
