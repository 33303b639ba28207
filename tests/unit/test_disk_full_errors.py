"""`disk_full_error` finds the full disk under the wrappers it is raised through: megatron's
async writer (``RuntimeError("Worker failure: ...")`` caused by the writer process's OSError)
inside torch's ``CheckpointException`` (per-rank failures), and a Ray task error's ``cause``.
The real runs are in tests/e2e/test_checkpoint_full_disk.py."""

import errno

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from verl_mp.utils.fs import disk_full_error

pytestmark = pytest.mark.unit


def _raised(exc, cause=None):
    try:
        raise exc from cause
    except BaseException as err:  # noqa: BLE001
        return err


def test_found_under_megatron_and_torch_wrappers():
    full = OSError(errno.ENOSPC, "No space left on device")
    worker = _raised(RuntimeError(f"Worker failure: {full}"), full)
    wrapped = CheckpointException("save failed", {0: (worker, None)})
    assert disk_full_error(wrapped) is full


def test_found_as_a_ray_cause_and_not_found_elsewhere():
    class TaskError(Exception):  # what Ray's RayTaskError carries: the worker's exception as `cause`
        def __init__(self, cause):
            super().__init__("task failed")
            self.cause = cause

    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert disk_full_error(_raised(RuntimeError("actor_rollout_ref rank 0 failed"), TaskError(quota))) is quota
    assert disk_full_error(_raised(RuntimeError("boom"), OSError(errno.EACCES, "Permission denied"))) is None
    assert disk_full_error(ValueError("unrelated")) is None
