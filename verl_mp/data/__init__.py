"""Prompt data: parquet schema, PromptDataset, resumable sampler, synthetic task.

- ``schema``: the verl parquet schema, validation errors naming file/row/column, ``write_rows``.
- ``dataset``: ``PromptDataset`` (chat template, length filter) and ``encode_messages``.
- ``batch``: ``PromptBatch``, the typed batch handed to the rollout.
- ``sampler``: ``ResumableBatchSampler`` (seeded, epoch-aware, ``state_dict``).
- ``synthetic``: the seeded ``synthetic_arith`` task written as train/test parquet.
- ``tiny_tokenizer``: a 311-token byte-level BPE chat tokenizer in Qwen2's format, for that
  task and for tests (it loads back exactly with ``AutoTokenizer`` and in vLLM).
"""
