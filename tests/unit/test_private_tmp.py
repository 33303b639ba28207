"""The per-user directories under the shared temp directory (`verl_mp.utils.fs.private_dir`:
``<tmp>/verl_mp-shm-<uid>``, ``<tmp>/verl_mp-runs-<uid>``): made 0700; a planted one (a
symbolic link, another user's directory, one others can write) is refused with the path and
the fix; files in it are written and read without following links.

Before this change ``os.makedirs(..., exist_ok=True)`` took whatever was there, and the
record was written through a planted link."""

import errno
import os
import stat
import tempfile

import pytest

from verl_mp.utils import fs, shm

pytestmark = pytest.mark.unit


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))  # what gettempdir() returns (TMPDIR)
    return root


def _record_dir(root):
    return root / f"{shm.RECORD_DIR_NAME}-{os.getuid()}"


def test_made_private(tmp_root):
    shm.record_segments()
    try:
        mode = stat.S_IMODE(os.lstat(_record_dir(tmp_root)).st_mode)
        assert mode == 0o700
        record = _record_dir(tmp_root) / f"{os.getpid()}.json"
        assert stat.S_IMODE(record.lstat().st_mode) == 0o600
    finally:
        shm.release_segments()


def test_a_planted_symlink_is_refused(tmp_root, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    _record_dir(tmp_root).symlink_to(victim)
    with pytest.raises(fs.UnsafePathError, match=rf"{_record_dir(tmp_root)} is a symbolic link .*rm -r .*TMPDIR"):
        shm.record_segments()
    assert not list(victim.iterdir())  # nothing was written through it


def test_a_directory_others_can_write_is_refused(tmp_root):
    _record_dir(tmp_root).mkdir(mode=0o700)
    os.chmod(_record_dir(tmp_root), 0o777)
    with pytest.raises(fs.UnsafePathError, match=r"is writable by group or others \(mode 777\)"):
        shm.record_segments()
    with pytest.raises(fs.UnsafePathError):
        shm.sweep_stale()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_is_refused(tmp_root):
    _record_dir(tmp_root).mkdir(mode=0o700)
    os.chown(_record_dir(tmp_root), 65534, 65534)
    with pytest.raises(fs.UnsafePathError, match=r"is owned by uid 65534, not by this user"):
        shm.record_segments()


def test_a_run_lock_directory_planted_as_a_link_is_refused(tmp_root, tmp_path):
    from verl_mp.utils import procs

    (tmp_root / f"{procs.RUN_LOCK_DIR_NAME}-{os.getuid()}").symlink_to(tmp_path)
    with pytest.raises(fs.UnsafePathError, match="is a symbolic link"):
        procs.begin_run()


def test_files_are_never_written_or_read_through_links(tmp_root, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    directory = fs.private_dir(shm.RECORD_DIR_NAME)
    record = os.path.join(directory, f"{os.getpid()}.json")
    os.symlink(victim, record)  # a link where the record goes
    with pytest.raises(OSError) as err:
        fs.read_private_file(record)
    assert err.value.errno == errno.ELOOP
    shm.record_segments()
    try:
        assert victim.read_text() == "precious" and not os.path.islink(record)  # replaced, not followed
    finally:
        shm.release_segments()
    os.symlink(victim, f"{record}.tmp.{os.getpid()}")  # a link where the temp file goes: removed first
    fs.write_private_file(directory, f"{os.getpid()}.json", b"{}")
    assert victim.read_text() == "precious"
