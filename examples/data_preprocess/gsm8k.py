"""Convert a local GSM8K file (jsonl or parquet with question/answer) to the prompt schema.

    python examples/data_preprocess/gsm8k.py --input gsm8k/train.jsonl --output_dir data/gsm8k
    # -> data/gsm8k/train.parquet  (split from the file name, or --split NAME)

Each answer must end with ``#### <number>``; that number (commas removed) becomes
``reward_model.ground_truth``. A row without it, or without a question, is an error
naming the file and line, unless ``--skip_bad_rows`` (then it is logged and skipped).
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from verl_mp.data.schema import write_rows
from verl_mp.reward.rules import extract_hash_answer

logger = logging.getLogger("gsm8k_preprocess")

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json-lines or .parquet file as dicts."""
    if path.suffix == ".parquet":
        return pq.read_table(str(path)).to_pylist()
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: expected a .jsonl or .parquet file")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def convert_record(record: dict[str, Any], split: str, index: int, source: str) -> dict[str, Any]:
    """One GSM8K record -> one schema row; ValueError naming the row and column if bad."""
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{source}: row {index}, column 'question': missing or empty")
    ground_truth = extract_hash_answer(answer) if isinstance(answer, str) else None
    if ground_truth is None:
        raise ValueError(
            f"{source}: row {index}, column 'answer': no '#### <number>' in {answer!r}"
        )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question.strip()} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def infer_split(path: Path) -> str:
    """'train' or 'test' from the file name; ValueError asking for --split otherwise."""
    hits = [s for s in ("train", "test") if s in path.stem.lower()]
    if len(hits) != 1:
        raise ValueError(f"cannot tell the split from {path.name}; pass --split train|test|...")
    return hits[0]


def convert_file(path: Path, output_dir: Path, split: str | None, skip_bad_rows: bool) -> Path:
    """Convert one input file to ``<output_dir>/<split>.parquet``; returns that path."""
    split = split or infer_split(path)
    rows, skipped = [], 0
    for index, record in enumerate(read_records(path)):
        try:
            rows.append(convert_record(record, split, index, str(path)))
        except ValueError as err:
            if not skip_bad_rows:
                raise
            skipped += 1
            logger.warning("skipping: %s", err)
    if not rows:
        raise ValueError(f"{path}: no usable rows ({skipped} skipped)")
    out = write_rows(rows, output_dir / f"{split}.parquet")
    logger.info("wrote %d rows to %s (%d bad rows skipped)", len(rows), out, skipped)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="GSM8K .jsonl or .parquet")
    parser.add_argument("--output_dir", required=True, type=Path)
    parser.add_argument("--split", default=None, help="output name; default from the file name")
    parser.add_argument("--skip_bad_rows", action="store_true")
    args = parser.parse_args(argv)
    return convert_file(args.input, args.output_dir, args.split, args.skip_bad_rows)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    main()
