"""A rank's routed experts as two grouped GEMMs per MoE layer (``moe.grouped_gemm``).

megatron-core's ``SequentialMLP`` runs one small MLP per local expert: with E local experts
that is 2E matmuls per layer, each a kernel launch with a host sync for the split sizes,
and on GPUs a poor fit when the experts' token counts are uneven. megatron's own
alternatives need transformer-engine (``TEGroupedMLP``) or the ``grouped_gemm`` package
(``GroupedMLP``, another parameter layout). `GroupedExperts` keeps SequentialMLP's
parameters, names, checkpoint keys and expert-parallel sharding (``local_experts.<i>.
linear_fc{1,2}.weight``: the HF converter, the weight sync and checkpoints see no change)
and computes all local experts with ``torch._grouped_mm`` (CUTLASS grouped GEMM for bf16 on
Hopper/Blackwell; a loop of matmuls elsewhere, CPU included):

    h = grouped_mm(x, stack(W1_e)^T, offs)        # [tokens, 2F]  (fc1, every expert at once)
    a = glu(h) * prob                             # megatron MLP's activation and scaling
    y = grouped_mm(a, stack(W2_e)^T, offs)        # [tokens, H]

``offs`` are the cumulative token counts per local expert (the dispatcher sorts tokens by
expert), each expert's rows padded with zero rows to a multiple of `ALIGN_ROWS`: the CUDA
kernels want every group 16-byte aligned (the weight gradient is a GEMM grouped along the
tokens); zero rows add nothing to any output or gradient and are dropped after. The expert
linears never communicate inside the experts module (megatron's dispatcher gathers and
reduces around it), so this is the same math as SequentialMLP.

`GroupedLinear` saves the input and the expert parameters themselves for the backward, not
the stacked copy: the stack is a transient of the forward (and again of the backward), so a
micro-batch in flight holds no extra copy of the rank's expert weights. The backward is two
grouped GEMMs too: ``dx = grouped_mm(dy, stack(W), offs)`` and the weight gradients
``dW_e = dy_e^T x_e`` as one GEMM grouped along the tokens.

Falls back to SequentialMLP's loop where the grouped kernel does not apply or was not
measured: biases, fp8/fp4, a latent projection, fused bias-activation kernels, router
probabilities applied to the input (top-1), no tokens at all, CUDA tensors other than bf16,
or dimensions whose rows are not 16-byte aligned (the kernel's requirement).
"""

from __future__ import annotations

import itertools

import torch
from megatron.core.transformer.moe.experts import SequentialMLP

_ALIGN_BYTES = 16
ALIGN_ROWS = 16
"""Each expert's token group is padded to a multiple of this many rows (16 bytes of bf16 is
8; 16 also covers 8-bit types)."""


def grouped_mm(x: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``x[rows of group g] @ weights[g]`` for every group, rows grouped by ``offs`` (the
    cumulative row counts, int32); ``weights``: ``[G, K, N]``."""
    return torch._grouped_mm(x, weights, offs=offs)


def aligned_rows(tokens_per_expert: torch.Tensor, device) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """``(rows, offs, total)``: where the dispatcher's rows go among the padded ones (None when
    every count is aligned already), the cumulative padded counts (int32, on ``device``: the
    grouped GEMM's ``offs``) and their sum; each expert's count is rounded up to `ALIGN_ROWS`.
    One host read of the counts, as SequentialMLP makes; the rest is host arithmetic."""
    counts = [int(c) for c in tokens_per_expert.tolist()]
    padded = [-(-c // ALIGN_ROWS) * ALIGN_ROWS for c in counts]
    ends = list(itertools.accumulate(padded))
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    if padded == counts:
        return None, offs, sum(padded)
    # an expert's rows move by (its padded start) - (its start among the dispatcher's rows)
    shifts = [end - p - (start - c) for end, p, start, c in zip(ends, padded, itertools.accumulate(counts), counts,
                                                                   strict=True)]
    shift = torch.repeat_interleave(torch.tensor(shifts, device=device), torch.tensor(counts, device=device),
                                    output_size=sum(counts))
    return torch.arange(sum(counts), device=device) + shift, offs, sum(padded)


class GroupedLinear(torch.autograd.Function):
    """``y[rows of expert e] = x[rows of expert e] @ W_e^T`` for weights in ``nn.Linear``'s
    ``[out, in]`` layout; saves ``x`` and the weights, not their stack (module doc)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, offs: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, offs, *weights)
        return grouped_mm(x, torch.stack(weights).transpose(1, 2), offs)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, offs, *weights = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_x = grouped_mm(grad_out, torch.stack(weights), offs) if ctx.needs_input_grad[0] else None
        if not any(ctx.needs_input_grad[2:]):
            return grad_x, None, *([None] * len(weights))
        grad_w = torch._grouped_mm(grad_out.t(), x, offs=offs)  # [experts, out, in], grouped along the tokens
        empty = torch.diff(offs, prepend=offs.new_zeros(1)) == 0  # an expert without tokens: exactly 0
        grad_w.masked_fill_(empty[:, None, None], 0)
        return grad_x, None, *grad_w.unbind(0)


class GroupedExperts(SequentialMLP):
    """SequentialMLP with the same parameters, computed as grouped GEMMs (module doc)."""

    def grouped_applies(self, hidden: torch.Tensor) -> bool:
        """Whether this call can take the grouped path (else SequentialMLP's loop)."""
        cfg = self.config
        if cfg.add_bias_linear or cfg.fp8 or cfg.fp4 or getattr(cfg, "moe_latent_size", None) is not None:
            return False
        if (cfg.bias_activation_fusion and not cfg.use_te_activation_func) or cfg.moe_apply_probs_on_input:
            return False
        if hidden.shape[0] == 0 or not hasattr(torch, "_grouped_mm"):
            return False
        # CUDA: bf16 only (CUTLASS; other dtypes would be torch's loop of matmuls, no faster than
        # SequentialMLP's, and not measured here); CPU: the loop, for fp32 and bf16 alike
        if hidden.dtype not in ((torch.bfloat16,) if hidden.is_cuda else (torch.float32, torch.bfloat16)):
            return False
        fc1 = self.local_experts[0].linear_fc1.weight
        fc2 = self.local_experts[0].linear_fc2.weight
        dims = (hidden.shape[-1], fc1.shape[0], fc2.shape[1], fc2.shape[0])
        return all(d * hidden.element_size() % _ALIGN_BYTES == 0 for d in dims)

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        hidden, probs = permuted_local_hidden_states, permuted_probs
        if self.num_local_experts == 1 or not self.grouped_applies(hidden):
            return super().forward(hidden, tokens_per_expert, probs)
        rows, offs, total = aligned_rows(tokens_per_expert, hidden.device)
        if rows is not None:  # zero rows up to each expert's aligned count
            hidden = hidden.new_zeros(total, hidden.shape[-1]).index_copy(0, rows, hidden)
            probs = probs.new_zeros(total).index_copy(0, rows, probs)
        intermediate = GroupedLinear.apply(hidden, offs, *(e.linear_fc1.weight for e in self.local_experts))
        intermediate = self._activation(intermediate, probs)
        out = GroupedLinear.apply(intermediate, offs, *(e.linear_fc2.weight for e in self.local_experts))
        return (out if rows is None else out.index_select(0, rows)), None

    def _activation(self, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """megatron MLP's activation and per-token scaling (its unfused path; `MLP.forward`)."""
        cfg = self.config
        if cfg.use_te_activation_func:  # the layer spec's activation module, on the whole fc1 output
            x = self.local_experts[0].activation_func(x)
        elif cfg.gated_linear_unit:
            gate, linear = torch.chunk(x, 2, dim=-1)
            if (clamp := cfg.activation_func_clamp_value) is not None:
                gate, linear = gate.clamp(max=clamp), linear.clamp(min=-clamp, max=clamp)
            x = cfg.activation_func(gate) * (linear + cfg.glu_linear_offset)
        else:
            x = cfg.activation_func(x)
        return (x * probs.unsqueeze(-1)).to(x.dtype)


class SequentialReference(torch.nn.Module):
    """``experts`` (a `GroupedExperts`) run by megatron's SequentialMLP loop: the reference
    the grouped path is compared with (tests, ``benchmarks/moe_experts.py``). Its parameters
    are the experts' (named ``experts.<name>``, for ``torch.func.functional_call``)."""

    def __init__(self, experts: GroupedExperts):
        super().__init__()
        self.experts = experts

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor):
        return SequentialMLP.forward(self.experts, hidden, tokens_per_expert, probs)
