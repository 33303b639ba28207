"""Loading a checkpoint runs no code from it: the per-rank RNG file and DCP's ``.metadata``.

Checked against the code before the fix: `_maybe_restore_rng` read ``rng/rank0.pt`` with
``weights_only=False`` and ran the planted ``__reduce__`` (the marker file appeared), and
torch's ``FileSystemReader.read_metadata`` ran the one planted in ``.metadata``.
"""

import pickle
import random

import numpy as np
import pytest
import torch

from verl_mp.engine import checkpoint

pytestmark = pytest.mark.unit


class _Payload:
    """Unpickling this creates ``marker``: what a malicious checkpoint would do instead."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _restore(directory, monkeypatch):
    """`_maybe_restore_rng` as rank 0 of a matching layout (no process group needed)."""
    monkeypatch.setattr(checkpoint, "_layout", lambda state: {"same": 1})
    monkeypatch.setattr(checkpoint.dist, "get_rank", lambda: 0)
    checkpoint._maybe_restore_rng(str(directory), {"same": 1}, state=None)


def test_rng_state_round_trips_with_weights_only(tmp_path, monkeypatch):
    (tmp_path / "rng").mkdir()
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    random.random(), np.random.normal(), torch.rand(1)  # mid-stream states, numpy gauss cached
    torch.save(checkpoint._rng_state(), tmp_path / "rng" / "rank0.pt")
    expected = (random.random(), np.random.normal(), np.random.rand(), torch.rand(3))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    _restore(tmp_path, monkeypatch)
    again = (random.random(), np.random.normal(), np.random.rand(), torch.rand(3))
    assert again[:3] == expected[:3] and torch.equal(again[3], expected[3])


def test_rng_file_of_the_old_format_still_restores(tmp_path, monkeypatch):
    """Checkpoints written before this change (plain random/numpy state tuples) resume."""
    (tmp_path / "rng").mkdir()
    random.seed(7), np.random.seed(8)
    torch.save(dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                    cuda=None, tracker={}), tmp_path / "rng" / "rank0.pt")
    expected = (random.random(), np.random.rand())
    random.seed(0), np.random.seed(0)
    _restore(tmp_path, monkeypatch)
    assert (random.random(), np.random.rand()) == expected


def test_rng_file_with_code_is_refused_and_named(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    (tmp_path / "rng").mkdir()
    torch.save({"python": _Payload(str(marker))}, tmp_path / "rng" / "rank0.pt")
    with pytest.raises(pickle.UnpicklingError) as err:
        _restore(tmp_path, monkeypatch)
    assert str(tmp_path / "rng" / "rank0.pt") in str(err.value)
    assert not marker.exists()


def test_dcp_metadata_with_code_is_refused_and_real_metadata_loads(tmp_path):
    import torch.distributed.checkpoint as dcp
    from verl_mp.patches import dcp_safe_metadata

    good = tmp_path / "good"
    dcp.save({"w": torch.arange(6.0).view(2, 3), "extra": {"note": "bytes item"}},
             storage_writer=dcp.FileSystemWriter(str(good)), no_dist=True)
    bad = tmp_path / "bad"
    bad.mkdir()
    marker = tmp_path / "pwned"
    (bad / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))

    dcp_safe_metadata.install()
    metadata = dcp.FileSystemReader(str(good)).read_metadata()
    assert metadata.state_dict_metadata["w"].size == torch.Size([2, 3])
    loaded = {"w": torch.zeros(2, 3), "extra": {"note": ""}}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(str(good)), no_dist=True)
    assert torch.equal(loaded["w"], torch.arange(6.0).view(2, 3))
    with pytest.raises(pickle.UnpicklingError) as err:
        dcp.FileSystemReader(str(bad)).read_metadata()
    assert str(bad / ".metadata") in str(err.value) and "io.open" in str(err.value)
    assert not marker.exists()
