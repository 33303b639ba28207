"""PromptBatch: the typed object that carries prompts from the dataset to the rollout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class PromptBatch:
    """A batch of B chat-templated prompts; every list has length B, in the same order.

    Prompts are ragged (no padding): the rollout engine takes token id lists directly,
    and padding/left-alignment is the trainer's job when it builds ``[B, T]`` tensors.
    """

    input_ids: list[list[int]]
    """Token ids of each chat-templated prompt, generation prompt included."""
    prompts: list[str]
    """The chat-templated prompt text the ids were encoded from."""
    ground_truths: list[str]
    """``reward_model.ground_truth`` of each row, handed to the reward function."""
    data_sources: list[str]
    """``data_source`` of each row; selects the reward function."""
    indices: list[int]
    """Position of each prompt in the PromptDataset (stable across epochs and resumes)."""
    extra_infos: list[dict[str, Any] | None] = field(default_factory=list)
    """``extra_info`` of each row (None where absent); empty list means all None."""

    def __post_init__(self) -> None:
        if not self.extra_infos:
            self.extra_infos = [None] * len(self.input_ids)
        lengths = {name: len(getattr(self, name)) for name in self._list_fields()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"PromptBatch fields differ in length: {lengths}")

    def __len__(self) -> int:
        return len(self.input_ids)

    @staticmethod
    def _list_fields() -> tuple[str, ...]:
        return ("input_ids", "prompts", "ground_truths", "data_sources", "indices", "extra_infos")

    def repeat_interleave(self, n: int) -> PromptBatch:
        """Repeat every prompt n times in place order (p0,p0,..,p1,p1,..), e.g. for GRPO groups."""
        if n < 1:
            raise ValueError(f"repeat_interleave n={n} must be >= 1")
        values = {
            name: [x for x in getattr(self, name) for _ in range(n)] for name in self._list_fields()
        }
        return PromptBatch(**values)

    @property
    def prompt_lengths(self) -> list[int]:
        """Number of prompt tokens of each prompt."""
        return [len(ids) for ids in self.input_ids]
