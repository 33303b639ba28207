"""CheckpointManager: commit, prune, latest, crash safety (incl. SIGKILL), resume modes."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

from verl_mp.trainer.checkpoint_manager import LATEST_FILENAME, CheckpointManager

pytestmark = pytest.mark.unit


def save(manager, step, payload="weights", **meta):
    """One full save of ``step`` from a single rank."""
    staging = manager.staging_dir(step)
    with open(os.path.join(staging, "model.pt"), "w") as f:
        f.write(payload)
    return manager.commit(step, meta)


def step_dirs(root):
    return sorted(name for name in os.listdir(root) if name.startswith("global_step_"))


def test_commit_layout_meta_and_latest(tmp_path):
    manager = CheckpointManager(str(tmp_path), keep_last=None)
    assert manager.latest() is None
    path = save(manager, 5, consumed_samples=40)
    assert path == str(tmp_path / "global_step_5")
    meta = json.loads((tmp_path / "global_step_5" / "meta.json").read_text())
    assert meta["step"] == 5 and meta["consumed_samples"] == 40 and meta["time"] > 0
    assert (tmp_path / "global_step_5" / "model.pt").read_text() == "weights"
    assert (tmp_path / LATEST_FILENAME).read_text().strip() == "5"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]
    save(manager, 10)
    assert manager.latest() == (10, str(tmp_path / "global_step_10"))


def test_latest_scans_dirs_not_txt(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    save(manager, 1)
    save(manager, 2)
    (tmp_path / LATEST_FILENAME).write_text("1\n")  # stale txt is ignored
    assert manager.latest()[0] == 2
    (tmp_path / "global_step_9").mkdir()  # no meta.json: incomplete
    (tmp_path / "global_step_x").mkdir()
    assert manager.latest()[0] == 2


def test_prune_keeps_last_n_and_ignores_others(tmp_path):
    manager = CheckpointManager(str(tmp_path), keep_last=2)
    (tmp_path / "notes").mkdir()
    for step in (1, 2, 3, 4):
        save(manager, step)
    assert step_dirs(tmp_path) == ["global_step_3", "global_step_4"]
    assert (tmp_path / "notes").is_dir()
    one = CheckpointManager(str(tmp_path), keep_last=1)
    save(one, 5)
    assert step_dirs(tmp_path) == ["global_step_5"]


def test_prune_leaves_newer_steps_and_resave_replaces(tmp_path):
    manager = CheckpointManager(str(tmp_path), keep_last=1)
    save(manager, 10, payload="old")
    save(manager, 20)
    (tmp_path / "global_step_10").mkdir()  # pretend 10 was kept, then resumed from 5
    save(manager, 10, payload="new")
    assert step_dirs(tmp_path) == ["global_step_10", "global_step_20"]
    assert (tmp_path / "global_step_10" / "model.pt").read_text() == "new"


def test_crash_mid_save_keeps_previous(tmp_path, caplog):
    manager = CheckpointManager(str(tmp_path), keep_last=3)
    save(manager, 1)
    staging = manager.staging_dir(2)
    with open(os.path.join(staging, "model.pt"), "w") as f:
        f.write("half")  # "crash": no commit
    assert manager.latest() == (1, str(tmp_path / "global_step_1"))
    with caplog.at_level(logging.WARNING):
        restarted = CheckpointManager(str(tmp_path), keep_last=3)
    assert "stale" in caplog.text and not os.path.exists(staging)
    assert restarted.resolve_resume("auto")[0] == 1


_KILLED_WRITER = """
import sys, time
from verl_mp.trainer.checkpoint_manager import CheckpointManager
staging = CheckpointManager(sys.argv[1]).staging_dir(2)
with open(staging + "/model.pt", "w") as f:
    for i in range(1000):
        f.write("x" * 1024)
        f.flush()
        if i == 0:
            print("writing", flush=True)
        time.sleep(0.01)
"""


def test_sigkill_before_commit_keeps_previous(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    save(manager, 1)
    manager.close()  # the writer below is the next run on this directory
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert os.path.getsize(tmp_path / ".tmp_global_step_2" / "model.pt") > 0
    assert manager.latest() == (1, str(tmp_path / "global_step_1"))
    assert CheckpointManager(str(tmp_path)).latest()[0] == 1
    assert not (tmp_path / ".tmp_global_step_2").exists()


def test_two_ranks_with_barrier(tmp_path):
    barrier = threading.Barrier(2, timeout=10)
    managers = [CheckpointManager(str(tmp_path), 1, rank, barrier.wait) for rank in (0, 1)]
    errors = []

    def run(rank):
        try:
            for step in (1, 2):
                staging = managers[rank].staging_dir(step)
                with open(os.path.join(staging, f"rank{rank}.pt"), "w") as f:
                    f.write(str(step))
                managers[rank].commit(step, {})
        except Exception as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not errors
    assert sorted(os.listdir(tmp_path / "global_step_2")) == ["meta.json", "rank0.pt", "rank1.pt"]
    assert step_dirs(tmp_path) == ["global_step_2"]


def test_resolve_resume_modes_and_errors(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    assert manager.resolve_resume("disable") is None
    assert manager.resolve_resume("auto") is None
    save(manager, 3)
    path = str(tmp_path / "global_step_3")
    assert manager.resolve_resume("auto") == (3, path)
    assert manager.resolve_resume(path) == (3, path)
    (tmp_path / "global_step_4").mkdir()
    for bad in (str(tmp_path / "global_step_4"), str(tmp_path / "global_step_7"), str(tmp_path)):
        with pytest.raises(ValueError, match=r"trainer\.resume_mode=.*not a complete checkpoint"):
            manager.resolve_resume(bad)


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="keep_last=0"):
        CheckpointManager(str(tmp_path), keep_last=0)
    manager = CheckpointManager(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="without staging_dir"):
        manager.commit(1, {})
    manager.staging_dir(1)
    with pytest.raises(ValueError, match="'step' is reserved"):
        manager.commit(1, {"step": 2})


_KILLED_RESAVE = """
import os, sys
from verl_mp.trainer.checkpoint_manager import CheckpointManager
kill_at, calls, real_replace = int(sys.argv[2]), [0], os.replace
def replace(src, dst):
    calls[0] += 1
    if calls[0] == kill_at:
        os._exit(9)  # killed: no cleanup runs
    real_replace(src, dst)
manager = CheckpointManager(sys.argv[1])
staging = manager.staging_dir(7)
with open(os.path.join(staging, "model.pt"), "w") as f:
    f.write("new")
os.replace = replace
manager.commit(7)
"""


def complete_copies(root, step):
    """Payloads of the complete copies of ``step`` anywhere under ``root`` (final or hidden)."""
    found = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.endswith(f"global_step_{step}") and os.path.isfile(os.path.join(path, "meta.json")):
            found.append((name, open(os.path.join(path, "model.pt")).read()))
    return sorted(found)


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_resave_killed_at_every_rename_never_loses_step(tmp_path, kill_at):
    """Re-saving step 7 is killed at its 1st (old copy aside), 2nd (new copy in) and 3rd
    (latest txt) rename: a complete copy of step 7 exists at every point, and the next start
    publishes the new one. The code before this change deleted the old copy first: killed
    at the first rename, the only complete copy was the staging dir, deleted at start."""
    first = CheckpointManager(str(tmp_path))
    save(first, 7, payload="old")
    first.close()
    proc = subprocess.run([sys.executable, "-c", _KILLED_RESAVE, str(tmp_path), str(kill_at)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    assert complete_copies(tmp_path, 7), os.listdir(tmp_path)
    restarted = CheckpointManager(str(tmp_path))
    assert restarted.latest() == (7, str(tmp_path / "global_step_7"))
    assert (tmp_path / "global_step_7" / "model.pt").read_text() == "new"
    assert complete_copies(tmp_path, 7) == [("global_step_7", "new")]
    assert (tmp_path / LATEST_FILENAME).read_text().strip() == "7"


def test_complete_staging_dir_is_published_at_start(tmp_path):
    """A crash after meta.json was written (the save was complete) leaves a staging dir
    that the next start publishes instead of deleting (the old code deleted it)."""
    manager = CheckpointManager(str(tmp_path))
    save(manager, 1)
    staging = manager.staging_dir(2)
    with open(os.path.join(staging, "model.pt"), "w") as f:
        f.write("two")
    with open(os.path.join(staging, "meta.json"), "w") as f:
        json.dump({"step": 2, "time": 0}, f)
    manager.close()
    restarted = CheckpointManager(str(tmp_path))
    assert restarted.latest() == (2, str(tmp_path / "global_step_2"))
    assert (tmp_path / "global_step_2" / "model.pt").read_text() == "two"
    assert not (tmp_path / ".tmp_global_step_2").exists()


_HOLDER = """
import sys, time
from verl_mp.trainer.checkpoint_manager import CheckpointManager
manager = CheckpointManager(sys.argv[1])
print("holding", flush=True)
time.sleep(120)
"""


def test_second_run_is_refused_while_the_first_holds_the_directory(tmp_path):
    from verl_mp.utils.fs import DirLockedError

    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(DirLockedError, match=rf"in use by a checkpoint manager \(pid {holder.pid} "):
            CheckpointManager(str(tmp_path))
        CheckpointManager(str(tmp_path), rank=1).latest()  # readers (other ranks) are not refused
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stdout.close()
    CheckpointManager(str(tmp_path)).close()  # a dead holder does not block


def test_checkpoint_dirs_are_private(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    path = save(manager, 1)
    assert os.stat(path).st_mode & 0o777 == 0o700
