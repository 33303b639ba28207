"""SequenceScorer: an optional reward model, a HF sequence classifier with one output."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from verl_mp.config.schema import RewardModelConfig


def check_reward_model(rm: RewardModelConfig) -> None:
    """An enabled reward model (``reward_model`` section) is an HF checkpoint with one output,
    read from its config.json before any process starts."""
    if not rm.enable:
        return
    if not rm.path or not os.path.isfile(os.path.join(rm.path, "config.json")):
        raise ValueError(f"reward_model.path={rm.path!r} is not an HF checkpoint directory (no config.json); "
                         "give a sequence-classifier checkpoint or set reward_model.enable=false")
    from transformers import AutoConfig  # start-up cost (~1 s); only runs with a reward model

    num_labels = AutoConfig.from_pretrained(rm.path).num_labels
    if num_labels != 1:
        raise ValueError(f"reward_model.path={rm.path!r} has num_labels={num_labels}; a reward model "
                         "outputs one score (num_labels=1)")


class SequenceScorer:
    """Scores whole texts with an ``AutoModelForSequenceClassification`` (num_labels=1).

    The model reads the score at the last non-pad token, so texts are padded on the right
    and, when too long, truncated on the left (the response end is what gets scored).
    Texts must already be in the format the reward model was trained on (e.g. its chat
    template); the scorer does no formatting.
    """

    def __init__(self, model: Any, tokenizer: Any, max_length: int = 4096, batch_size: int = 8):
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(f"reward model must have num_labels=1, got {model.config.num_labels}")
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("reward model tokenizer has neither pad_token nor eos_token")
            tokenizer.pad_token = tokenizer.eos_token
        # The model finds the last real token through pad_token_id.
        model.config.pad_token_id = tokenizer.pad_token_id
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "left"
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(
        cls, path: str, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> SequenceScorer:
        """Load a local HF reward model directory (model + tokenizer)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> torch.Tensor:
        """One score per text: float32 [len(texts)] on CPU."""
        device = next(self.model.parameters()).device
        scores = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]), padding=True, truncation=True,
                max_length=self.max_length, add_special_tokens=False, return_tensors="pt",
            ).to(device)
            logits = self.model(**batch).logits  # [b, 1]
            scores.append(logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0, dtype=torch.float32)
