"""PromptDataset: parquet prompt files -> chat-templated, length-filtered prompts in memory."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from verl_mp.data.batch import PromptBatch
from verl_mp.data.schema import (
    GROUND_TRUTH_FIELD,
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    BadRowError,
    check_row,
    validate_columns,
)

logger = logging.getLogger(__name__)

# Rows tokenized per call: bounds peak memory on large files.
_ENCODE_CHUNK_ROWS = 4096


@dataclass(slots=True)
class PromptRecord:
    """One usable prompt; ``file`` and ``row`` say where it came from."""

    input_ids: list[int]
    prompt: str
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any] | None
    file: str
    row: int


def encode_messages(tokenizer: Any, messages: list[dict], **template_kwargs: Any) -> list[int]:
    """Chat-template and tokenize messages (generation prompt added) into a list of ids.

    transformers 5.x returns a BatchEncoding from ``apply_chat_template(tokenize=True)``,
    4.x a plain list; both are accepted.
    """
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def _as_dict(extra_info: Any) -> dict[str, Any] | None:
    """extra_info as a dict: pyarrow gives a dict for a struct, key/value pairs for a map."""
    if extra_info is None or isinstance(extra_info, dict):
        return extra_info
    return dict(extra_info)


class PromptDataset:
    """Prompts from parquet files in the verl schema (see ``verl_mp.data.schema``).

    Rows are read with pyarrow, validated, rendered with the tokenizer's chat template and
    tokenized once at construction. Prompts longer than ``max_prompt_length`` tokens are
    dropped (count in ``num_dropped_too_long``, logged). Bad rows (empty prompt,
    non-string ground truth, missing data source) raise a ValueError naming file, row and
    column, unless ``skip_bad_rows=True``: then each is logged and counted in
    ``num_skipped_bad``. A missing required column is always an error.
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        skip_bad_rows: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        setting: str = "data.train_files",
    ):
        """``setting``: the config key the files came from (named in errors)."""
        if max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length={max_prompt_length} must be >= 1")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template. Fix: use an instruct/chat tokenizer or "
                "set tokenizer.chat_template to a Jinja template before building the dataset."
            )
        self.files = [str(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
        if not self.files:
            raise ValueError("PromptDataset needs at least one parquet file (data.train_files)")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        self.skip_bad_rows = skip_bad_rows
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.setting = setting
        self.num_rows_read = 0
        self.num_skipped_bad = 0
        self.num_dropped_too_long = 0
        self.records: list[PromptRecord] = []
        for file in self.files:
            self.records.extend(self._load_file(file))
        self._log_summary()

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> PromptRecord:
        return self.records[index]

    @property
    def data_sources(self) -> set[str]:
        """The distinct data sources in the dataset (to check reward routing up front)."""
        return {r.data_source for r in self.records}

    def get_batch(self, indices: Sequence[int]) -> PromptBatch:
        """Gather the prompts at ``indices`` (e.g. one batch from the sampler)."""
        records = [self.records[i] for i in indices]
        return PromptBatch(
            input_ids=[r.input_ids for r in records],
            prompts=[r.prompt for r in records],
            ground_truths=[r.ground_truth for r in records],
            data_sources=[r.data_source for r in records],
            extra_infos=[r.extra_info for r in records],
            indices=[int(i) for i in indices],
        )

    def _load_file(self, file: str) -> list[PromptRecord]:
        """Validate one file's columns, then its rows; return the usable prompts."""
        if not Path(file).is_file():
            raise ValueError(f"{self.setting}: {file} does not exist")
        try:
            schema = pq.read_schema(file)
        except (pa.ArrowInvalid, OSError) as err:
            raise ValueError(f"{self.setting}: {file} is not a parquet file ({err}). Prompts come as parquet in "
                             "the verl schema: docs/data.md; examples/data_preprocess/gsm8k.py converts "
                             "GSM8K json/jsonl") from None
        validate_columns(schema, file, self.prompt_key)
        wanted = [self.prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
        wanted += [c for c in OPTIONAL_COLUMNS if c in schema.names]
        rows = pq.read_table(file, columns=wanted).to_pylist()
        self.num_rows_read += len(rows)
        good = [(i, row) for i, row in enumerate(rows) if self._is_good(row, file, i)]
        records = []
        for start in range(0, len(good), _ENCODE_CHUNK_ROWS):
            records.extend(self._encode(good[start : start + _ENCODE_CHUNK_ROWS], file))
        return records

    def _is_good(self, row: dict[str, Any], file: str, row_index: int) -> bool:
        """Check one row; raise on a bad row unless skip_bad_rows (then log and count it)."""
        try:
            check_row(row, file, row_index, self.prompt_key)
        except BadRowError as err:
            if not self.skip_bad_rows:
                raise
            self.num_skipped_bad += 1
            logger.warning("skipping bad row (data.skip_bad_rows=True): %s", err)
            return False
        return True

    def _encode(self, rows: list[tuple[int, dict[str, Any]]], file: str) -> list[PromptRecord]:
        """Chat-template and tokenize checked rows; drop those over max_prompt_length.

        Renders the text, then tokenizes all texts in one call with add_special_tokens=False:
        exactly what apply_chat_template(tokenize=True) does, but batched (much faster).
        """
        texts = [
            self.tokenizer.apply_chat_template(
                row[self.prompt_key], add_generation_prompt=True, tokenize=False,
                **self.chat_template_kwargs,
            )
            for _, row in rows
        ]
        all_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        records = []
        for (row_index, row), text, input_ids in zip(rows, texts, all_ids, strict=True):
            if len(input_ids) > self.max_prompt_length:
                self.num_dropped_too_long += 1
                continue
            records.append(PromptRecord(
                input_ids=list(input_ids), prompt=text,
                ground_truth=row["reward_model"][GROUND_TRUTH_FIELD],
                data_source=row["data_source"], extra_info=_as_dict(row.get("extra_info")),
                file=file, row=row_index,
            ))
        return records

    def _log_summary(self) -> None:
        """Log what was kept and dropped (a warning when prompts were dropped); an empty
        dataset is an error."""
        if self.num_dropped_too_long or self.num_skipped_bad:
            logger.warning("%s: %d of %d prompts dropped as longer than data.max_prompt_length=%d, %d bad rows "
                           "skipped", self.setting, self.num_dropped_too_long, self.num_rows_read,
                           self.max_prompt_length, self.num_skipped_bad)
        logger.info(
            "PromptDataset: %d rows read from %d file(s), %d kept, %d dropped as longer than "
            "data.max_prompt_length=%d, %d bad rows skipped",
            self.num_rows_read, len(self.files), len(self.records),
            self.num_dropped_too_long, self.max_prompt_length, self.num_skipped_bad,
        )
        if not self.records:
            raise ValueError(
                f"{self.setting}: no usable prompts in {self.files}: {self.num_rows_read} rows read, "
                f"{self.num_dropped_too_long} longer than data.max_prompt_length="
                f"{self.max_prompt_length}, {self.num_skipped_bad} bad. Fix: raise "
                "data.max_prompt_length or repair the files."
            )
