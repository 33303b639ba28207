"""Resume is exact, and a trainer killed mid-checkpoint resumes from the last complete one."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, resumed_from, run_cli, run_log, steps_logged

pytestmark = pytest.mark.e2e

# wall-clock dependent metrics can differ between runs; everything else must not
VOLATILE = ("timing/", "perf/", "rollout/sync_gbps")


def _by_step(out_dir):
    rows = {}
    for r in read_jsonl(str(out_dir / "metrics.jsonl")):
        assert r["step"] not in rows, f"step {r['step']} logged twice"
        rows[r["step"]] = r
    return {s: {k: v for k, v in r.items() if not k.startswith(VOLATILE)} for s, r in rows.items()}


def test_resume_gives_identical_metrics(tiny_run_inputs, tmp_path):
    """An interrupted run resumed from its step-2 checkpoint logs where it resumed, runs only
    steps 3-4, keeps the first run's rows of steps 0-2 as they were written (wall-clock
    timings included), and logs for steps 3-4 exactly what an uninterrupted run logs.
    Shown to fail with ``RLTrainer.resume`` returning 0 at once (a silent fresh start): the
    former check, equal metrics for steps 3-4, passed it (the re-run is deterministic)."""
    common = ["--config-name", "grpo", "trainer.total_steps=4", "trainer.save_freq=2", "trainer.test_freq=2"]
    full = tmp_path / "full"
    run_cli(common + base_overrides(tiny_run_inputs, full, "torchrun", steps=4))
    split = tmp_path / "split"
    run_cli(common + base_overrides(tiny_run_inputs, split, "torchrun", steps=4)
            + ["trainer.max_steps_this_run=2"])
    assert not (split / "checkpoints" / "global_step_4").exists()
    first_log = run_log(split)
    assert steps_logged(first_log) == [0, 1, 2] and not resumed_from(first_log)
    rows_before = (split / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows_before] == [0, 1, 2]
    run_cli(common + base_overrides(tiny_run_inputs, split, "torchrun", steps=4))
    second_log = run_log(split, start=len(first_log.encode()))
    assert resumed_from(second_log) == {("global_step_2", 2)}, second_log[-3000:]
    assert steps_logged(second_log) == [3, 4]  # steps 1-2 (and the step-0 validation) were not re-run
    rows_after = (split / "metrics.jsonl").read_text().splitlines()
    assert rows_after[:3] == rows_before  # the first run's rows, byte for byte
    a, b = _by_step(full), _by_step(split)
    assert set(a) == set(b) == {0, 1, 2, 3, 4}
    for step in (3, 4):
        assert a[step].keys() == b[step].keys()
        for key, value in a[step].items():
            assert b[step][key] == value, (step, key, value, b[step][key])


def test_sigkill_during_checkpoint_write(tiny_run_inputs, tmp_path):
    out = tmp_path / "killed"
    args = ["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, "torchrun", steps=3),
            "trainer.save_freq=1", "trainer.test_freq=0"]
    env = dict(os.environ, VERL_MP_CKPT_COMMIT_DELAY_S="30")
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
