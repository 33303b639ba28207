"""A trainer killed mid-checkpoint resumes from the last complete one.

That a resume continues exactly (the resume line, only the later steps logged, the earlier
rows kept byte for byte, the next step equal to the uninterrupted run's) is
tests/e2e/test_train_cli.py::test_resume_continues_exactly (smoke) under torchrun, and
tests/e2e/test_reliability.py (after a killed rank and after Ctrl-C, against an uninterrupted
3-step run); a run stopped by ``trainer.max_steps_this_run`` and resumed:
tests/e2e/test_placement.py::test_split_critic_trains_checkpoints_and_resumes.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, resumed_from, run_cli, run_log, steps_logged

pytestmark = pytest.mark.e2e


def test_sigkill_during_checkpoint_write(tiny_run_inputs, tmp_path):
    out = tmp_path / "killed"
    args = ["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, "torchrun", steps=3),
            "trainer.save_freq=1", "trainer.test_freq=0"]
    env = dict(os.environ, VERL_MP_CKPT_COMMIT_DELAY_S="30@2")  # step 2's commit held back (step 1's not)
    proc = subprocess.Popen([sys.executable, "-m", "verl_mp", "train", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    staging = out / "checkpoints" / ".tmp_global_step_2"
    deadline = time.time() + 400
    try:
        while not (staging / "trainer_state.json").exists():
            assert proc.poll() is None, "trainer exited before reaching the second checkpoint"
            assert time.time() < deadline, "timed out waiting for the second checkpoint"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # torchrun puts ranks in sessions of their own: they must notice the launcher is gone
    # and die (verl_mp.utils.launch.exit_with_launcher), not train on.
    deadline = time.time() + 20
    while _processes_mentioning(str(out)) and time.time() < deadline:
        time.sleep(0.5)
    assert not _processes_mentioning(str(out)), "ranks survived the SIGKILL of their launcher"
    ckpts = out / "checkpoints"
    assert (ckpts / "global_step_1" / "meta.json").exists()
    assert not (ckpts / "global_step_2").exists()  # the half-written one never looks complete

    killed_log = run_log(out)
    run_cli(args)
    resumed_log = run_log(out, start=len(killed_log.encode()))
    assert resumed_from(resumed_log) == {("global_step_1", 1)}, resumed_log[-3000:]
    assert steps_logged(resumed_log) == [2, 3]
    assert [r["step"] for r in read_jsonl(str(out / "metrics.jsonl"))] == [1, 2, 3]
    assert (ckpts / "global_step_3" / "meta.json").exists()
    assert not staging.exists()


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (Linux /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids
