"""The parquet prompt schema (the one verl users already have) and its validation.

One row is one prompt::

    data_source  : str                          picks the reward function
    prompt       : list<struct<role, content>>  chat messages, fed to the chat template
    ability      : str            (optional)    e.g. "math"; informational
    reward_model : struct<style, ground_truth>  ground_truth must be a string
    extra_info   : struct/map     (optional)    passed to the reward function as a dict

Errors name the file, the row number (0-based, within the file) and the column, and say
how to fix the data. ``write_rows`` writes rows in this schema with explicit types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
OPTIONAL_COLUMNS = ("ability", "extra_info")
GROUND_TRUTH_FIELD = "ground_truth"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), (GROUND_TRUTH_FIELD, pa.string())])


class BadRowError(ValueError):
    """A row that violates the schema or cannot be read; carries the file, row number and
    column (None: the problem names the rows itself, e.g. an unreadable row group)."""

    def __init__(self, file: str, row: int, column: str | None, problem: str, fix: str):
        self.file, self.row, self.column = file, row, column
        where = f"row {row}, column '{column}': " if column is not None else ""
        super().__init__(f"{file}: {where}{problem}. Fix: {fix}")


def validate_columns(schema: pa.Schema, file: str, prompt_key: str = "prompt") -> None:
    """Raise ValueError naming the file and column if a required column is missing."""
    required = [prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise ValueError(
            f"{file}: missing required column(s) {missing}; found {schema.names}. Fix: write "
            f"the file with columns {required} (see examples/data_preprocess/gsm8k.py)."
        )
    rm_type = schema.field("reward_model").type
    if not pa.types.is_struct(rm_type) or rm_type.get_field_index(GROUND_TRUTH_FIELD) < 0:
        raise ValueError(
            f"{file}: column 'reward_model.{GROUND_TRUTH_FIELD}' is missing "
            f"(reward_model has type {rm_type}). Fix: store reward_model as a struct "
            f"{{'style': 'rule', 'ground_truth': '<answer as a string>'}}."
        )


def check_row(row: dict[str, Any], file: str, row_index: int, prompt_key: str = "prompt") -> None:
    """Raise BadRowError if the row's prompt, ground truth or data source is unusable."""
    _check_messages(row.get(prompt_key), file, row_index, prompt_key)
    ground_truth = (row.get("reward_model") or {}).get(GROUND_TRUTH_FIELD)
    if not isinstance(ground_truth, str):
        raise BadRowError(
            file, row_index, f"reward_model.{GROUND_TRUTH_FIELD}",
            f"expected a string, got {type(ground_truth).__name__} {ground_truth!r}",
            "store every ground truth as a string, e.g. str(answer)",
        )
    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        raise BadRowError(
            file, row_index, "data_source", f"expected a non-empty string, got "
            f"{row.get('data_source')!r}", "set data_source, e.g. 'openai/gsm8k'",
        )


def _check_messages(messages: Any, file: str, row_index: int, column: str) -> None:
    """A prompt must be a non-empty list of {role: str, content: str} with some content."""
    fix = "store the prompt as [{'role': 'user', 'content': '<question>'}]"
    if messages is None or (isinstance(messages, list) and not messages):
        raise BadRowError(file, row_index, column, f"empty prompt ({messages!r})", fix)
    if not isinstance(messages, list):
        raise BadRowError(file, row_index, column, f"expected a list of chat messages, got "
                          f"{type(messages).__name__} {messages!r}", fix)
    for i, message in enumerate(messages):
        ok = isinstance(message, dict) and isinstance(message.get("role"), str)
        if not ok or not isinstance(message.get("content"), str):
            raise BadRowError(file, row_index, column, f"message {i} is {message!r}", fix)
    if not any(m["content"].strip() for m in messages):
        raise BadRowError(file, row_index, column, "every message content is empty", fix)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Build a table in the prompt schema; extra_info's type is inferred from the rows."""
    columns = {
        "data_source": pa.array([r["data_source"] for r in rows], pa.string()),
        "prompt": pa.array([r["prompt"] for r in rows], pa.list_(MESSAGE_TYPE)),
        "ability": pa.array([r.get("ability") for r in rows], pa.string()),
        "reward_model": pa.array([r["reward_model"] for r in rows], REWARD_MODEL_TYPE),
    }
    if any(r.get("extra_info") is not None for r in rows):
        columns["extra_info"] = pa.array([r.get("extra_info") for r in rows])
    return pa.table(columns)


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Validate rows and write them to a parquet file (parent folders are created)."""
    path = Path(path)
    for i, row in enumerate(rows):
        check_row(row, str(path), i)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows_to_table(rows), str(path))
    return path
