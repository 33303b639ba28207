"""The critic's value head: replaces GPTModel's output layer on the last pipeline stage."""

from __future__ import annotations

import torch


class ValueHead(torch.nn.Module):
    """``hidden [s, b, h]`` -> ``values [s, b, 1]`` with a replicated ``Linear(h, 1)``.

    Same call signature as megatron's output layer (returns ``(output, None)``). Under
    sequence parallelism the hidden states are first gathered over the TP group; every
    TP rank then computes the same values and loss, so the gather's backward only splits
    the gradient (no reduction), and the head's own gradients are already identical
    on all TP ranks. Weights are initialised identically on every rank (fixed seed);
    HF checkpoints carry them as ``score.weight`` / ``score.bias``.
    """

    def __init__(self, config, init_std: float = 0.02, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(1, config.hidden_size, generator=gen) * init_std
        self.weight = torch.nn.Parameter(weight.to(config.params_dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=config.params_dtype))
        self.sequence_parallel = config.sequence_parallel

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            )
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None
