"""A full disk during a checkpoint, on a real file system that fills up: the run stops with
the message that the previous checkpoint is intact, the same under Ray as under torchrun, and
the previous checkpoint is complete and unchanged.

The checkpoints directory is a tmpfs (needs root: CI runs as root; skipped otherwise). Once
step 1's checkpoint is published, the tmpfs is shrunk (``mount -o remount,size=``) to what it
holds plus 64 KiB, so step 2's checkpoint runs out of space in the ranks' writers (Ray
actors, or torchrun ranks) with ENOSPC.

Before this change a Ray run reported a generic worker error (``actor_rollout_ref rank 0
failed in save_checkpoint: ...``), without the intact checkpoint."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from .helpers import base_overrides

pytestmark = pytest.mark.e2e


def _mount_tmpfs(path, size):
    path.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): needs root")


def _used_bytes(path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(tiny_run_inputs, tmp_path, launcher):
    out = tmp_path / launcher
    ckpts = out / "checkpoints"
    _mount_tmpfs(ckpts, "256m")
    try:
        args = ["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, launcher, steps=3),
                "trainer.save_freq=1", "trainer.test_freq=0", "trainer.val_before_train=false"]
        proc = subprocess.Popen([sys.executable, "-m", "verl_mp", "train", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.time() + 500
        while not (ckpts / "global_step_1" / "meta.json").exists():
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.time() < deadline, "no checkpoint of step 1"
            time.sleep(0.1)
        before = {p.relative_to(ckpts): p.read_bytes() for p in (ckpts / "global_step_1").rglob("*") if p.is_file()}
        size = _used_bytes(ckpts) + (64 << 10)
        subprocess.run(["mount", "-o", f"remount,size={size}", str(ckpts)], check=True)  # now it is full
        assert proc.wait(timeout=500) == 1
        last = proc.stderr.read().strip().splitlines()[-1]
        print(last)  # which writer's error it was varies: pytest -rP shows it
        assert last.startswith("verl-mp train: run failed: "), last
        assert "the checkpoint of step 2 could not be written" in last and "No space left on device" in last, last
        assert f"the last complete checkpoint, {ckpts / 'global_step_1'}, is intact" in last, last
        assert "trainer.resume_mode=auto" in last and "phase save of step 2" in last, last
        after = {p.relative_to(ckpts): p.read_bytes() for p in (ckpts / "global_step_1").rglob("*") if p.is_file()}
        assert after == before  # complete and unchanged
        assert not (ckpts / "global_step_2").exists()
    finally:
        subprocess.run(["umount", "-l", str(ckpts)], capture_output=True)
