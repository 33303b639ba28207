"""PromptDataset and schema validation: bad inputs, length filter, batches."""

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_mp.data.dataset import PromptDataset, encode_messages
from verl_mp.data.schema import write_rows
from verl_mp.demo.tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def row(question="What is 1+2?", answer="3", source="synthetic_arith", extra=None):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra or {"index": 0},
    }


def write_raw(path, columns):
    """Write a table bypassing write_rows' validation (to produce bad files)."""
    pq.write_table(pa.table(columns), str(path))
    return str(path)


def good_columns(n=3):
    rows = [row(f"What is {i}+1?", str(i + 1)) for i in range(n)]
    return {k: [r[k] for r in rows] for k in rows[0]}


def test_reads_rows_and_applies_chat_template(tmp_path, tokenizer):
    path = write_rows([row("What is 1+2?", "3"), row("What is 5-4?", "1")], tmp_path / "a.parquet")
    ds = PromptDataset(str(path), tokenizer, max_prompt_length=64)
    assert len(ds) == 2 and ds.data_sources == {"synthetic_arith"}
    assert ds[0].prompt == "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "user", "content": "What is 1+2?"}]
    assert ds[0].input_ids == encode_messages(tokenizer, messages)
    batch = ds.get_batch([1, 0])
    assert batch.ground_truths == ["1", "3"] and batch.indices == [1, 0]
    assert batch.extra_infos[0] == {"index": 0} and len(batch.repeat_interleave(3)) == 6


def test_too_long_prompts_dropped_and_counted(tmp_path, tokenizer, caplog):
    rows = [row("What is 1+2?"), row("What is " + "1+" * 40 + "1?"), row("What is 9-9?")]
    path = write_rows(rows, tmp_path / "a.parquet")
    with caplog.at_level(logging.INFO, logger="verl_mp.data.dataset"):
        ds = PromptDataset([path], tokenizer, max_prompt_length=30)
    assert len(ds) == 2 and ds.num_dropped_too_long == 1
    assert "1 dropped as longer than data.max_prompt_length=30" in caplog.text
    assert [r.row for r in ds.records] == [0, 2]


def test_missing_column_names_file_and_column(tmp_path, tokenizer):
    columns = good_columns()
    del columns["reward_model"]
    path = write_raw(tmp_path / "nocol.parquet", columns)
    with pytest.raises(ValueError, match=r"nocol\.parquet.*missing required column.*reward_model"):
        PromptDataset(path, tokenizer, 64, skip_bad_rows=True)


def test_ground_truth_field_missing(tmp_path, tokenizer):
    columns = good_columns()
    columns["reward_model"] = [{"style": "rule"}] * 3
    path = write_raw(tmp_path / "nogt.parquet", columns)
    with pytest.raises(ValueError, match=r"nogt\.parquet.*reward_model\.ground_truth"):
        PromptDataset(path, tokenizer, 64)


def test_empty_prompt_names_file_row_column(tmp_path, tokenizer):
    columns = good_columns()
    columns["prompt"][1] = []
    path = write_raw(tmp_path / "empty.parquet", columns)
    with pytest.raises(ValueError, match=r"empty\.parquet: row 1, column 'prompt': empty prompt"):
        PromptDataset(path, tokenizer, 64)


def test_non_string_ground_truth_names_file_row_column(tmp_path, tokenizer):
    columns = good_columns()
    columns["reward_model"] = [{"style": "rule", "ground_truth": i} for i in range(3)]
    path = write_raw(tmp_path / "intgt.parquet", columns)
    expected = r"intgt\.parquet: row 0, column 'reward_model\.ground_truth': expected a string"
    with pytest.raises(ValueError, match=expected):
        PromptDataset(path, tokenizer, 64)


@pytest.mark.parametrize("prompt,problem", [
    (None, r"empty prompt \(None\)"),
    ([{"role": "user", "content": " \n"}], "every message content is empty"),
    ([{"role": "user", "content": None}], "message 0 is"),
])
def test_unusable_prompts_name_file_row_column(tmp_path, tokenizer, prompt, problem):
    columns = good_columns()
    columns["prompt"][2] = prompt
    path = write_raw(tmp_path / "bad.parquet", columns)
    with pytest.raises(ValueError, match=rf"bad\.parquet: row 2, column 'prompt': {problem}"):
        PromptDataset(path, tokenizer, 64)


def test_prompt_as_plain_string_is_refused(tmp_path, tokenizer):
    columns = good_columns()
    columns["prompt"] = ["What is 1+1?", "What is 2+2?", "What is 3+3?"]
    path = write_raw(tmp_path / "str.parquet", columns)
    with pytest.raises(ValueError, match=r"str\.parquet: row 0, column 'prompt': expected a list of chat "
                                         r"messages, got str"):
        PromptDataset(path, tokenizer, 64)


@pytest.mark.parametrize("truths,bad_row", [(["1", None], 1), ([1.0, 2.0], 0), ([[1], [2]], 0)],
                         ids=["null", "float", "list"])
def test_other_non_string_ground_truths(tmp_path, tokenizer, truths, bad_row):
    # a parquet column has one type: floats or lists make every row bad, the first is named
    columns = {k: v[:2] for k, v in good_columns().items()}
    columns["reward_model"] = [{"style": "rule", "ground_truth": t} for t in truths]
    path = write_raw(tmp_path / "gt.parquet", columns)
    expected = rf"gt\.parquet: row {bad_row}, column 'reward_model\.ground_truth': expected a string"
    with pytest.raises(ValueError, match=expected):
        PromptDataset(path, tokenizer, 64)


def test_bad_row_in_second_file_names_that_file_and_its_row(tmp_path, tokenizer):
    first = write_rows([row(), row()], tmp_path / "first.parquet")
    columns = good_columns()
    columns["prompt"][1] = []
    second = write_raw(tmp_path / "second.parquet", columns)
    with pytest.raises(ValueError, match=r"second\.parquet: row 1, column 'prompt'"):
        PromptDataset([str(first), second], tokenizer, 64)


def test_skip_bad_rows_logs_and_counts(tmp_path, tokenizer, caplog):
    columns = good_columns(4)
    columns["prompt"][0] = [{"role": "user", "content": "  "}]
    columns["reward_model"][2] = {"style": "rule", "ground_truth": None}
    path = write_raw(tmp_path / "mixed.parquet", columns)
    with caplog.at_level(logging.WARNING, logger="verl_mp.data.dataset"):
        ds = PromptDataset(path, tokenizer, 64, skip_bad_rows=True)
    assert len(ds) == 2 and ds.num_skipped_bad == 2
    assert "mixed.parquet: row 2, column 'reward_model.ground_truth'" in caplog.text
    assert "row 0, column 'prompt'" in caplog.text


def test_all_rows_dropped_is_an_error(tmp_path, tokenizer):
    path = write_rows([row("What is 1+2?")], tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="no usable prompts.*max_prompt_length=3"):
        PromptDataset(path, tokenizer, max_prompt_length=3)


def test_tokenizer_without_chat_template(tmp_path):
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    path = write_rows([row()], tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="no chat_template"):
        PromptDataset(path, tok, 64)
