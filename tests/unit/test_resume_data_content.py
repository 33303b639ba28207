"""A resume compares the training files by content, not only by path: a file rewritten under
the same path (other rows, or one byte changed) is refused by ``trainer.resume_mode=auto`` with
the file named, and warned about when the checkpoint is given explicitly.

Before this change the paths were equal and the run resumed its sampler's state on other
prompts."""

import logging

import pytest

from tests.unit.test_trainer_resume_check import make_cfg, make_model, trainer
from verl_mp.data.schema import write_rows
from verl_mp.trainer.resume_check import check_resume, file_fingerprint, preflight_resume

pytestmark = pytest.mark.unit


def _rows(n, offset=0):
    return [{"data_source": "synthetic_arith", "prompt": [{"role": "user", "content": f"What is {i}+{i}?"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}} for i in range(offset, offset + n)]


@pytest.fixture
def saved(tmp_path):
    write_rows(_rows(64), tmp_path / "train.parquet")
    cfg = make_cfg(tmp_path, make_model(tmp_path / "model"))
    trainer(cfg).save(2)
    return cfg, tmp_path / "out" / "checkpoints" / "global_step_2", tmp_path / "train.parquet"


def test_same_files_resume(saved):
    cfg, ckpt, _ = saved
    check_resume(str(ckpt), cfg, explicit=False)
    preflight_resume(cfg)


def test_a_rewritten_file_under_the_same_path_is_refused(saved):
    cfg, ckpt, data = saved
    before = file_fingerprint(str(data))
    write_rows(_rows(64, offset=1000), data)
    with pytest.raises(ValueError, match=rf"the content of {data} is not the content the checkpoint was trained "
                                         rf"on \({before} then, bytes:\d+ sha256:[0-9a-f]{{16}} now\)"):
        preflight_resume(cfg)


def test_one_changed_byte_is_noticed(saved):
    cfg, ckpt, data = saved
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1  # same size, same path
    data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="data.train_files: the content of"):
        check_resume(str(ckpt), cfg, explicit=False)


def test_an_explicit_checkpoint_resumes_with_a_warning(saved, caplog):
    cfg, ckpt, data = saved
    write_rows(_rows(10), data)
    with caplog.at_level(logging.WARNING):
        check_resume(str(ckpt), cfg, explicit=True)
    assert "the content of" in caplog.text


def test_large_files_are_fingerprinted_by_size_head_and_tail(tmp_path, monkeypatch):
    import verl_mp.trainer.resume_check as rc

    monkeypatch.setattr(rc, "_FULL_HASH_BYTES", 1024)
    monkeypatch.setattr(rc, "_SAMPLED_BYTES", 256)
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * 16)
    first = file_fingerprint(str(path))
    assert first.startswith("bytes:4096 sampled-sha256:")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1  # in the tail (a parquet footer)
    path.write_bytes(bytes(raw))
    assert file_fingerprint(str(path)) != first
    assert file_fingerprint(str(tmp_path / "none")) == "missing"
