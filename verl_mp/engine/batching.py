"""Micro-batches from a padded batch: by row count or by a token budget, padded or packed.

Input rows are ``[B, S]`` with an ``attention_mask`` that is one contiguous block of ones
per row (left and/or right padding). Every micro-batch *left-aligns* its rows (token
``start + t`` of a row goes to column ``t``) because megatron's rotary embedding uses the
position in the tensor, not ``position_ids``: after alignment every sequence starts at
position 0, as in HF with its own position ids. Two model-input layouts:

- padded: ``input_ids [b, s]`` with ``s`` the longest row, rounded up to ``pad_to``;
- packed (padding removed): ``input_ids [1, T]`` holding the rows back to back with THD
  ``PackedSeqParams`` (needs the ``sdpa`` or ``te`` attention backend).

Per-token tensors handed to the loss are always in the aligned ``[b, s]`` layout.

Mixture-of-experts layers exchange tokens between ranks, so those ranks must run the same
number of micro-batches (and, with megatron's allgather dispatcher, of the same shape):
`pad_model_inputs` zero-pads a micro-batch's model inputs to a larger ``[rows, width]``
(`MicroBatch.crop` cuts the model output back) and `dummy_like` makes a padding micro-batch
whose output and loss the engine ignores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def row_spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_mask [B, S]`` -> ``(starts [B], lengths [B])``; rows must be contiguous, non-empty."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("attention_mask has a row without tokens; drop empty rows before the engine")
    starts = mask.int().argmax(dim=1)
    cols = torch.arange(mask.shape[1])[None, :]
    contiguous = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    if not torch.equal(contiguous, mask):
        raise ValueError("attention_mask rows must be one contiguous block of ones (left/right "
                         "padding only); holes in a row are not supported")
    return starts, lengths


def plan_micro_batches(lengths: list[int], *, micro_batch_size: int | None,
                       max_tokens: int | None, packed: bool) -> list[list[int]]:
    """Group row indices into micro-batches.

    By count: consecutive groups of ``micro_batch_size`` rows. By token budget: rows sorted by
    length (longest first) fill a micro-batch while its cost stays ``<= max_tokens``; the cost
    is the sum of lengths when packed, ``rows * longest`` when padded.
    """
    if max_tokens is None:
        size = micro_batch_size or len(lengths)
        return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    too_long = [n for n in lengths if n > max_tokens]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens exceeds max_tokens_per_micro_batch="
                         f"{max_tokens}; raise it to at least the longest sequence")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups, current = [], []
    for i in order:
        rows = current + [i]
        cost = sum(lengths[j] for j in rows) if packed else len(rows) * max(lengths[j] for j in rows)
        if current and cost > max_tokens:
            groups.append(current)
            rows = [i]
        current = rows
    return groups + [current] if current else groups


@dataclass
class MicroBatch:
    rows: torch.Tensor
    """Row indices into the (DP-local) batch, ``[b]``."""
    starts: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    """``[b, s]`` True on real (aligned) tokens."""
    model_inputs: dict
    """``input_ids``, ``position_ids``, ``packed_seq_params`` (None when padded)."""
    targets: torch.Tensor
    """Next-token ids in the model-input layout (``[b, s]`` or ``[1, T]``); 0 where none."""
    tensors: dict = field(default_factory=dict)
    """The caller's batch tensors for these rows, per-token ones aligned to ``[b, s]``."""
    model_shape: tuple[int, int] | None = None
    """``(b, s)`` of the model inputs before `pad_model_inputs` (None: not padded)."""
    dummy: bool = False
    """A padding micro-batch (`dummy_like`): run for the collectives, results ignored."""

    @property
    def packed(self) -> bool:
        return self.model_inputs["packed_seq_params"] is not None

    @property
    def has_next(self) -> torch.Tensor:
        """``[b, s]`` True where a next token exists (the positions that have a log-prob)."""
        cols = torch.arange(self.valid.shape[1], device=self.valid.device)[None, :]
        return cols < (self.lengths.to(self.valid.device) - 1)[:, None]

    def unpack(self, values: torch.Tensor, next_token: bool = False) -> torch.Tensor:
        """Model-layout per-token values (``[b, s]`` or ``[1, T]``) -> aligned ``[b, s]``.

        Zero off real tokens (and, with ``next_token``, on each row's last token).
        """
        keep = self.has_next if next_token else self.valid
        if self.packed:
            out = values.new_zeros(self.valid.shape)
            values = out.masked_scatter(self.valid, values.reshape(-1)[: int(self.valid.sum())])
        return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))

    def crop(self, output: torch.Tensor) -> torch.Tensor:
        """Model output ``[rows, width, ...]`` of padded inputs -> the unpadded ``[b, s, ...]``."""
        if self.model_shape is None:
            return output
        b, s = self.model_shape
        return output[:b, :s]

    def model_token_mask(self) -> torch.Tensor:
        """``[rows, width]`` bool in the model-input layout: True on real tokens."""
        ids = self.model_inputs["input_ids"]
        if self.packed:
            total = int(self.lengths.sum())
            return (torch.arange(ids.shape[1], device=ids.device) < total)[None, :]
        keep = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        keep[: self.valid.shape[0], : self.valid.shape[1]] = self.valid.to(ids.device)
        return keep

    def to(self, device: torch.device) -> MicroBatch:
        """Model inputs, targets, masks and tensors on ``device`` (row indices stay on CPU)."""
        inputs = dict(self.model_inputs)
        for key in ("input_ids", "position_ids"):
            inputs[key] = inputs[key].to(device)
        params = inputs["packed_seq_params"]
        if params is not None:
            params.cu_seqlens_q = params.cu_seqlens_kv = params.cu_seqlens_q.to(device)
        tensors = {k: v.to(device) for k, v in self.tensors.items()}
        return MicroBatch(self.rows, self.starts, self.lengths, self.valid.to(device), inputs,
                          self.targets.to(device), tensors, self.model_shape, self.dummy)


def align_rows(x: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, width: int,
               valid: torch.Tensor) -> torch.Tensor:
    """``x [B, S, ...]`` -> ``[b, width, ...]`` with row r shifted left by ``starts[r]``; 0 off ``valid``."""
    cols = (starts[:, None] + torch.arange(width)[None, :]).clamp(max=x.shape[1] - 1)
    out = x[rows[:, None], cols]
    keep = valid.reshape(*valid.shape, *([1] * (out.dim() - 2)))
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype))


def build_micro_batch(input_ids: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor,
                      rows: list[int], *, packed: bool, pad_to: int = 1,
                      extra: dict | None = None) -> MicroBatch:
    """One micro-batch of ``rows`` from the DP-local ``input_ids [B, S]`` (see module doc)."""
    rows_t = torch.tensor(rows, dtype=torch.long)
    st, ln = starts[rows_t], lengths[rows_t]
    width = int(ln.max())
    valid = torch.arange(width)[None, :] < ln[:, None]
    ids = align_rows(input_ids, rows_t, st, width, valid)
    next_valid = torch.arange(width)[None, :] < (ln - 1)[:, None]
    targets = torch.where(next_valid, ids.roll(-1, dims=1), torch.zeros((), dtype=ids.dtype))
    if packed:
        model_inputs, targets = _packed_inputs(ids, targets, valid, ln, pad_to)
    else:
        width_padded = -(-width // pad_to) * pad_to
        ids = torch.nn.functional.pad(ids, (0, width_padded - width))
        targets = torch.nn.functional.pad(targets, (0, width_padded - width))
        valid = torch.nn.functional.pad(valid, (0, width_padded - width))
        model_inputs = dict(input_ids=ids, position_ids=_positions(ids.shape), packed_seq_params=None)
    tensors = {k: _select(v, rows_t, st, valid, input_ids.shape) for k, v in (extra or {}).items()}
    return MicroBatch(rows_t, st, ln, valid, model_inputs, targets, tensors)


def pad_model_inputs(mb: MicroBatch, rows: int, width: int) -> MicroBatch:
    """A copy of ``mb`` whose model inputs are zero-padded to ``[rows, width]``.

    Extra rows are separate sequences and extra columns come after every real token, so
    causal attention keeps the real tokens' outputs unchanged. Packed micro-batches (one
    row) get the extra tokens as one more THD sequence.
    """
    ids = mb.model_inputs["input_ids"]
    b, s = ids.shape
    if (rows, width) == (b, s):
        return mb
    if rows < b or width < s or (mb.packed and rows != 1):
        raise ValueError(f"cannot pad a [{b}, {s}] micro-batch to [{rows}, {width}]")
    pad = (0, width - s, 0, rows - b)
    inputs = dict(input_ids=torch.nn.functional.pad(ids, pad), position_ids=_positions((rows, width)),
                  packed_seq_params=mb.model_inputs["packed_seq_params"])
    if mb.packed:
        inputs["packed_seq_params"] = _extend_packed(inputs["packed_seq_params"], width)
    # targets stay in the unpadded layout: they meet the output after `crop`.
    return MicroBatch(mb.rows, mb.starts, mb.lengths, mb.valid, inputs, mb.targets, mb.tensors,
                      mb.model_shape or (b, s), mb.dummy)


def _extend_packed(params, width: int):
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = params.cu_seqlens_q
    if int(cu[-1]) < width:
        cu = torch.cat([cu, cu.new_tensor([width])])
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)


def dummy_like(mb: MicroBatch) -> MicroBatch:
    """A padding micro-batch with ``mb``'s inputs (see the module doc)."""
    return MicroBatch(mb.rows, mb.starts, mb.lengths, mb.valid, mb.model_inputs, mb.targets, mb.tensors,
                      mb.model_shape, dummy=True)


def _positions(shape) -> torch.Tensor:
    return torch.arange(shape[1]).expand(shape).contiguous()


def _packed_inputs(ids, targets, valid, lengths, pad_to: int):
    from megatron.core.packed_seq_params import PackedSeqParams

    total = int(lengths.sum())
    padded = -(-total // pad_to) * pad_to
    flat_ids = torch.nn.functional.pad(ids[valid], (0, padded - total))[None, :]
    flat_targets = torch.nn.functional.pad(targets[valid], (0, padded - total))[None, :]
    bounds = [0] + torch.cumsum(lengths, 0).tolist() + ([padded] if padded > total else [])
    cu = torch.tensor(bounds, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=longest, max_seqlen_kv=longest)
    return dict(input_ids=flat_ids, position_ids=_positions(flat_ids.shape), packed_seq_params=params), flat_targets


def _select(value: torch.Tensor, rows, starts, valid, batch_shape) -> torch.Tensor:
    if value.dim() >= 2 and tuple(value.shape[:2]) == tuple(batch_shape):
        return align_rows(value, rows, starts, valid.shape[1], valid)
    if value.shape[0] == batch_shape[0]:
        return value[rows]
    raise ValueError(f"batch tensor of shape {list(value.shape)} matches neither [B, S]={list(batch_shape)} "
                     f"nor [B, ...]")


def scatter_rows(out: torch.Tensor, mb: MicroBatch, aligned: torch.Tensor) -> None:
    """Write aligned ``[b, s]`` values back into the CPU ``out [B, S]`` at their original columns."""
    aligned = aligned.detach().cpu()
    width = aligned.shape[1]
    cols = mb.starts[:, None] + torch.arange(width)[None, :]
    keep = mb.valid.cpu()[:, :width] & (cols < out.shape[1])
    out[mb.rows[:, None].expand_as(cols)[keep], cols[keep]] = aligned[keep].to(out.dtype)
