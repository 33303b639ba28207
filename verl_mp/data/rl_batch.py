"""RLBatch: the typed object every phase of an RL step reads and fills in.

Layout. ``B`` samples (prompt-major: the ``n`` samples of prompt ``p`` are rows
``p*n .. p*n+n-1`` and share ``group_ids``). Sequences are packed left-aligned and
right-padded: ``input_ids[i] = prompt_i + response_i + pad``, shape ``[B, S]``; causal
attention needs no mask for right padding. Per-token RL quantities are ``[B, T]`` over
response tokens (``T`` = longest response), right-padded, zero where
``response_mask == 0``. Response token ``j`` of sample ``i`` sits at sequence position
``prompt_lengths[i] + j``; its log-prob comes from the logits at the position before it
(see `response_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch


@dataclass(kw_only=True)
class RLBatch:
    input_ids: torch.Tensor
    """[B, S] int64: prompt + response tokens, right-padded with ``pad_token_id``."""
    prompt_lengths: torch.Tensor
    """[B] int64."""
    response_lengths: torch.Tensor
    """[B] int64."""
    responses: torch.Tensor
    """[B, T] int64: response tokens, right-padded."""
    response_mask: torch.Tensor
    """[B, T] float32: 1 for the response tokens the policy generated (the loss's tokens); 0 on
    padding and, in multi-turn rollouts, on the tool responses' tokens (context only)."""
    group_ids: torch.Tensor
    """[B] int64: samples of the same prompt share an id."""
    ground_truths: list[str] = field(default_factory=list)
    data_sources: list[str] = field(default_factory=list)
    rollout_log_probs: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_level_scores: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    rollout_weights: torch.Tensor | None = None
    """[B, T] float32: the rollout correction's per-token weights (importance weights x
    rejection mask, `verl_mp.algo.rollout_correction`); None when no correction is on."""
    weight_versions: torch.Tensor | None = None
    """[B] int64: the actor version (updates applied) whose weights generated each sample."""
    routed_experts: torch.Tensor | None = None
    """[B, S, L, k] int16, positions of ``input_ids``: the experts each token was routed to in
    each mixture-of-experts layer (routing replay), -1 where unknown (padding, the last token
    of each sequence)."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def from_samples(cls, prompt_ids: list[list[int]], response_ids: list[list[int]], n: int,
                     pad_token_id: int, ground_truths: list[str], data_sources: list[str]) -> RLBatch:
        """Pack ragged prompts (one per group) and responses (``n`` per prompt)."""
        num = len(response_ids)
        prompts = [prompt_ids[i // n] for i in range(num)]
        p_len = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
        r_len = torch.tensor([len(r) for r in response_ids], dtype=torch.int64)
        seq = int((p_len + r_len).max()) if num else 0
        t = max(int(r_len.max()) if num else 0, 1)
        input_ids = torch.full((num, seq), pad_token_id, dtype=torch.int64)
        responses = torch.full((num, t), pad_token_id, dtype=torch.int64)
        for i, (p, r) in enumerate(zip(prompts, response_ids, strict=True)):
            input_ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.int64)
            responses[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
        mask = (torch.arange(t)[None, :] < r_len[:, None]).float()
        return cls(input_ids=input_ids, prompt_lengths=p_len, response_lengths=r_len,
                   responses=responses, response_mask=mask,
                   group_ids=torch.arange(num, dtype=torch.int64) // n,
                   ground_truths=[ground_truths[i // n] for i in range(num)],
                   data_sources=[data_sources[i // n] for i in range(num)])

    def set_routing(self, per_sample: list[torch.Tensor]) -> None:
        """``routed_experts`` from one ``[len(prompt) + len(response), L, k]`` tensor per row."""
        if len(per_sample) != len(self):
            raise ValueError(f"routing of {len(per_sample)} samples for a batch of {len(self)}")
        num_layers, k = per_sample[0].shape[1:]
        out = torch.full((*self.input_ids.shape, num_layers, k), -1, dtype=torch.int16)
        for i, routing in enumerate(per_sample):
            if routing.shape[0] != int(self.prompt_lengths[i] + self.response_lengths[i]):
                raise ValueError(f"sample {i}: routing of {routing.shape[0]} positions for "
                                 f"{int(self.prompt_lengths[i] + self.response_lengths[i])} tokens")
            out[i, : routing.shape[0]] = routing
        self.routed_experts = out

    def response_positions(self) -> torch.Tensor:
        """[B, T] int64: the sequence position whose next-token log-prob scores response
        token j, i.e. ``prompt_lengths[i] + j - 1`` (clamped into range on padding)."""
        t = self.responses.shape[1]
        pos = self.prompt_lengths[:, None] - 1 + torch.arange(t)[None, :]
        return pos.clamp(max=self.input_ids.shape[1] - 1)

    def gather_response(self, per_position: torch.Tensor) -> torch.Tensor:
        """Pick ``[B, T]`` response values out of ``[B, S]`` next-token values; 0 on padding.
        The result is on the CPU, like every RLBatch tensor."""
        out = torch.gather(per_position.cpu(), 1, self.response_positions())
        return out * self.response_mask

    def select(self, index: torch.Tensor | list[int]) -> RLBatch:
        """Rows ``index`` of every field (a mini-batch, a data-parallel shard)."""
        index = torch.as_tensor(index, dtype=torch.int64)
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                values[f.name] = v.index_select(0, index)
            elif isinstance(v, list):
                values[f.name] = [v[i] for i in index.tolist()]
            else:
                values[f.name] = v
        return replace(self, **values)

    def chunks(self, size: int) -> list[RLBatch]:
        """Consecutive row chunks of ``size`` (the last may be shorter)."""
        return [self.select(list(range(s, min(s + size, len(self))))) for s in range(0, len(self), size)]

    def require(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"RLBatch is missing {missing}: the phase that fills them has not run")


def to_positions(batch: RLBatch, per_token: torch.Tensor) -> torch.Tensor:
    """Inverse of `RLBatch.gather_response`: ``[B, T]`` response values placed at their
    next-token positions in a ``[B, S]`` tensor (0 elsewhere), the engine's layout."""
    out = torch.zeros(batch.input_ids.shape, dtype=per_token.dtype)
    mask = batch.response_mask > 0
    rows = torch.arange(len(batch))[:, None].expand_as(mask)
    out[rows[mask], batch.response_positions()[mask]] = per_token[mask]
    return out


def attention_mask(batch: RLBatch) -> torch.Tensor:
    """[B, S] int64: 1 on prompt and response tokens (right padding is 0)."""
    total = batch.prompt_lengths + batch.response_lengths
    return (torch.arange(batch.input_ids.shape[1])[None, :] < total[:, None]).long()
