"""examples/data_preprocess/gsm8k.py on a few handwritten GSM8K rows."""

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_mp.data.dataset import PromptDataset
from verl_mp.demo.tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "data_preprocess" / "gsm8k.py"
ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3+4=7\n#### 7"},
    {"question": "A car costs $12,500 and a bike $500. Total?", "answer": "12500+500\n#### 13,000"},
    {"question": "It is 5 degrees and drops 8. Temperature?", "answer": "5-8=-3\n#### -3"},
]


@pytest.fixture(scope="module")
def gsm8k():
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_converts_jsonl_to_schema(tmp_path, gsm8k):
    src = write_jsonl(tmp_path / "gsm8k_train.jsonl", ROWS)
    out = gsm8k.main(["--input", str(src), "--output_dir", str(tmp_path / "out")])
    assert out == tmp_path / "out" / "train.parquet"
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "13000", "-3"]
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["ability"] == "math"
    assert rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert rows[2]["extra_info"] == {"split": "train", "index": 2, "question": ROWS[2]["question"],
                                     "answer": ROWS[2]["answer"]}
    ds = PromptDataset(out, build_tiny_tokenizer(), max_prompt_length=512)
    assert len(ds) == 3


def test_parquet_input_and_explicit_split(tmp_path, gsm8k):
    import pyarrow as pa

    src = tmp_path / "raw.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), str(src))
    out = gsm8k.main(["--input", str(src), "--output_dir", str(tmp_path), "--split", "dev"])
    assert out.name == "dev.parquet" and pq.read_table(out).num_rows == 3


def test_bad_row_names_file_row_column(tmp_path, gsm8k):
    src = write_jsonl(tmp_path / "test.jsonl", ROWS + [{"question": "Q?", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"test\.jsonl: row 3, column 'answer'"):
        gsm8k.main(["--input", str(src), "--output_dir", str(tmp_path / "o")])
    out = gsm8k.main(["--input", str(src), "--output_dir", str(tmp_path / "o"), "--skip_bad_rows"])
    assert out.name == "test.parquet" and pq.read_table(out).num_rows == 3


def test_split_must_be_inferable(tmp_path, gsm8k):
    src = write_jsonl(tmp_path / "gsm8k.jsonl", ROWS)
    with pytest.raises(ValueError, match="--split"):
        gsm8k.main(["--input", str(src), "--output_dir", str(tmp_path)])
