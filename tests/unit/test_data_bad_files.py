"""Bad data files stop with the file, the rows and the cause, or are skipped and counted
with ``data.skip_bad_rows``: pages garbled on disk, a truncated file, text that is not UTF-8,
a chat template that raises on a prompt. Each file is a real parquet file damaged the way a
disk, a download or a careless writer would.

Before this change: garbled pages raised an uncaught OSError ("Corrupt snappy compressed
data"), non-UTF-8 text a UnicodeDecodeError without file or row that skip_bad_rows could not
skip, and a failing template escaped as a Jinja traceback."""

import logging

import pyarrow.parquet as pq
import pytest

from verl_mp.data.dataset import PromptDataset
from verl_mp.data.schema import BadRowError, rows_to_table
from verl_mp.demo.tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.unit

GROUP_ROWS = 50


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _rows(n):
    return [{"data_source": "synthetic_arith", "prompt": [{"role": "user", "content": f"What is {i} plus {i}? " * 3}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)}} for i in range(n)]


def _write(path, n=200, **kwargs):
    pq.write_table(rows_to_table(_rows(n)), str(path), row_group_size=GROUP_ROWS, **kwargs)
    return str(path)


def _garble_row_group(path, group):
    """Flip bytes inside the pages of one row group's prompt column (what a bad disk does)."""
    meta = pq.ParquetFile(path).metadata.row_group(group)
    column = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema.startswith("prompt"))
    start = column.data_page_offset
    data = bytearray(open(path, "rb").read())
    for i in range(start + 40, start + column.total_compressed_size - 8):
        data[i] ^= 0x5A
    open(path, "wb").write(bytes(data))


def test_garbled_pages_stop_with_file_rows_and_cause(tmp_path, tokenizer):
    path = _write(tmp_path / "garbled.parquet")
    _garble_row_group(path, 1)
    with pytest.raises(BadRowError) as err:
        PromptDataset(path, tokenizer, max_prompt_length=64)
    text = str(err.value)
    assert text.startswith(f"{path}: rows 50-99 (row group 1) cannot be read: OSError: ") and "Fix: " in text, text


def test_garbled_pages_are_skipped_and_counted(tmp_path, tokenizer, caplog):
    path = _write(tmp_path / "garbled.parquet")
    _garble_row_group(path, 1)
    with caplog.at_level(logging.WARNING):
        ds = PromptDataset(path, tokenizer, max_prompt_length=64, skip_bad_rows=True)
    assert len(ds) == 150 and ds.num_skipped_bad == 50 and ds.num_rows_read == 200
    assert {r.row for r in ds.records} == set(range(50)) | set(range(100, 200))  # rows keep their numbers
    assert "skipping 50 bad rows" in caplog.text and "rows 50-99 (row group 1)" in caplog.text


@pytest.mark.parametrize("cut", [0.5, 0.98])
def test_a_truncated_file_names_the_file(tmp_path, tokenizer, cut):
    path = _write(tmp_path / "cut.parquet")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: int(len(data) * cut)])
    with pytest.raises(ValueError, match=rf"data.train_files: {path} is not a parquet file \("):
        PromptDataset(path, tokenizer, max_prompt_length=64, skip_bad_rows=True)


def _non_utf8(path, row):
    """A file whose prompt text in ``row`` holds a byte that is not UTF-8 (latin-1 written as is)."""
    _write(path, compression="none", use_dictionary=False)
    data = bytearray(open(path, "rb").read())
    marker = f"What is {row} plus {row}? ".encode()
    at = data.find(marker)
    assert at >= 0 and data.find(marker, at + len(marker) * 3) < 0
    data[at + 5] = 0xE9  # "What \xe9s": 'é' in latin-1
    open(path, "wb").write(bytes(data))
    return str(path)


def test_text_that_is_not_utf8_names_file_row_and_column(tmp_path, tokenizer):
    path = _non_utf8(tmp_path / "latin1.parquet", 137)
    with pytest.raises(BadRowError, match=rf"{path}: row 137, column 'prompt': text that is not valid UTF-8 .*Fix: "):
        PromptDataset(path, tokenizer, max_prompt_length=64)


def test_text_that_is_not_utf8_is_skipped_and_counted(tmp_path, tokenizer):
    path = _non_utf8(tmp_path / "latin1.parquet", 137)
    ds = PromptDataset(path, tokenizer, max_prompt_length=64, skip_bad_rows=True)
    assert len(ds) == 199 and ds.num_skipped_bad == 1 and 137 not in {r.row for r in ds.records}


TEMPLATE = ("{% for m in messages %}{% if m['content'].startswith('What is 3 ') %}"
            "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
            "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_a_chat_template_that_raises_names_the_row_and_template(tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    path = _write(tmp_path / "data.parquet", n=10)
    with pytest.raises(BadRowError) as err:
        PromptDataset(path, tokenizer, max_prompt_length=64)
    text = str(err.value)
    assert text.startswith(f"{path}: row 3, column 'prompt': the chat template of ") and "failed on this prompt" in text
    assert "TemplateError: Conversation roles must alternate user/assistant" in text and "chat_template" in text
    ds = PromptDataset(path, tokenizer, max_prompt_length=64, skip_bad_rows=True)
    assert len(ds) == 9 and ds.num_skipped_bad == 1
