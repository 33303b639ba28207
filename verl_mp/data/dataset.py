"""PromptDataset: parquet prompt files -> chat-templated, length-filtered prompts in memory."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
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
# Rows converted to Python objects at a time; a chunk with a bad row is converted row by row.
_CONVERT_CHUNK_ROWS = 1024


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
    non-string ground truth, missing data source, text that is not UTF-8, a prompt the chat
    template raises on, rows of a row group whose pages are corrupt) raise a `BadRowError`
    (a ValueError) naming file, row, column and cause, unless ``skip_bad_rows=True``: then
    each is logged and counted in ``num_skipped_bad``. A missing required column, or a file
    that is not parquet at all (no footer), is always an error.
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
        try:  # page checksums are verified where the writer stored them
            parquet = pq.ParquetFile(file, page_checksum_verification=True)
            schema = parquet.schema_arrow
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{self.setting}: {file} is not a parquet file ({err}). Prompts come as parquet in "
                             "the verl schema: docs/data.md; examples/data_preprocess/gsm8k.py converts "
                             "GSM8K json/jsonl") from None
        validate_columns(schema, file, self.prompt_key)
        wanted = [self.prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
        wanted += [c for c in OPTIONAL_COLUMNS if c in schema.names]
        good = [(i, row) for i, row in self._read_rows(parquet, file, wanted) if self._is_good(row, file, i)]
        records = []
        for start in range(0, len(good), _ENCODE_CHUNK_ROWS):
            records.extend(self._encode(good[start : start + _ENCODE_CHUNK_ROWS], file))
        return records

    def _read_rows(self, parquet: pq.ParquetFile, file: str, columns: list[str]) -> Iterator[tuple[int, dict]]:
        """(row number in the file, row) of every readable row, row group by row group.

        A row group whose pages cannot be read (corrupt, truncated, a failed checksum) and a
        row whose text is not valid UTF-8 are bad rows: an error naming the file, the rows and
        the cause, or skipped and counted with ``skip_bad_rows``."""
        first = 0
        for group in range(parquet.num_row_groups):
            num_rows = parquet.metadata.row_group(group).num_rows
            self.num_rows_read += num_rows
            try:
                table = parquet.read_row_group(group, columns=columns)
            except (pa.ArrowException, OSError) as err:
                self._bad(BadRowError(
                    file, first, None, f"rows {first}-{first + num_rows - 1} (row group {group}) cannot be read: "
                    f"{type(err).__name__}: {err}", "write the file again from its source (its pages are "
                    "corrupt or truncated)"), count=num_rows)
                first += num_rows
                continue
            yield from self._table_rows(table, file, first)
            first += num_rows

    def _table_rows(self, table: pa.Table, file: str, first: int) -> Iterator[tuple[int, dict]]:
        """``table``'s rows as Python objects; a chunk that fails to convert (text that is not
        UTF-8) is converted row by row to name the bad rows."""
        for start in range(0, table.num_rows, _CONVERT_CHUNK_ROWS):
            chunk = table.slice(start, _CONVERT_CHUNK_ROWS)
            try:
                rows = chunk.to_pylist()
            except UnicodeDecodeError:
                rows = [self._row_or_none(chunk, i, file, first + start + i) for i in range(chunk.num_rows)]
            for i, row in enumerate(rows):
                if row is not None:
                    yield first + start + i, row

    def _row_or_none(self, chunk: pa.Table, i: int, file: str, row_index: int) -> dict | None:
        row = {}
        for name in chunk.column_names:
            try:
                row[name] = chunk.column(name).slice(i, 1).to_pylist()[0]
            except UnicodeDecodeError as err:
                self._bad(BadRowError(file, row_index, name, f"text that is not valid UTF-8 ({err})",
                                      "write the file's text as UTF-8 (decode it with its source's encoding)"))
                return None
        return row

    def _bad(self, err: BadRowError, count: int = 1) -> None:
        """A bad row (or ``count`` of them): raise, or log and count with skip_bad_rows."""
        if not self.skip_bad_rows:
            raise err
        self.num_skipped_bad += count
        logger.warning("skipping %s (data.skip_bad_rows=True): %s", "a bad row" if count == 1 else f"{count} bad rows",
                       err)

    def _is_good(self, row: dict[str, Any], file: str, row_index: int) -> bool:
        """Check one row; raise on a bad row unless skip_bad_rows (then log and count it)."""
        try:
            check_row(row, file, row_index, self.prompt_key)
        except BadRowError as err:
            self._bad(err)
            return False
        return True

    def _render(self, row: dict[str, Any], file: str, row_index: int) -> str | None:
        """The chat-templated prompt text; a template that raises on this row is a bad row."""
        try:
            return self.tokenizer.apply_chat_template(row[self.prompt_key], add_generation_prompt=True,
                                                      tokenize=False, **self.chat_template_kwargs)
        except Exception as err:  # noqa: BLE001  (a Jinja template's error: any type; reported, not swallowed)
            source = getattr(self.tokenizer, "name_or_path", "") or "the tokenizer"
            self._bad(BadRowError(
                file, row_index, self.prompt_key, f"the chat template of {source} failed on this prompt: "
                f"{type(err).__name__}: {err}", "make the messages fit the template (roles in the order it "
                "expects), or fix the template (the tokenizer's chat_template)"))
            return None

    def _encode(self, rows: list[tuple[int, dict[str, Any]]], file: str) -> list[PromptRecord]:
        """Chat-template and tokenize checked rows; drop those over max_prompt_length.

        Renders the text, then tokenizes all texts in one call with add_special_tokens=False:
        exactly what apply_chat_template(tokenize=True) does, but batched (much faster).
        """
        rendered = [(row_index, row, self._render(row, file, row_index)) for row_index, row in rows]
        rendered = [(row_index, row, text) for row_index, row, text in rendered if text is not None]
        texts = [text for _, _, text in rendered]
        all_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        records = []
        for (row_index, row, text), input_ids in zip(rendered, all_ids, strict=True):
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
