"""Router and token-dispatch settings of a mixture-of-experts engine (ignored by dense models)."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_DISPATCHERS = ("auto", "allgather", "alltoall")


@dataclass(kw_only=True)
class MoEConfig:
    aux_loss_coeff: float = 0.0
    """Weight of the load-balancing loss added to the training loss: per MoE layer megatron's
    Switch-Transformer loss ``E * sum_i f_i * P_i`` of each micro-batch (``f_i``: share of the
    top-k assignments that went to expert i, ``P_i``: mean router probability of expert i),
    summed over layers and averaged over the step's micro-batches weighted by their tokens
    (padding included). 0 disables it. (HF configs carry ``router_aux_loss_coef`` for HF's own
    training; it is not read.)"""
    z_loss_coeff: float = 0.0
    """Weight of the router z-loss (ST-MoE: ``logsumexp(router logits)^2`` averaged over the
    step's tokens, summed over layers). 0 disables it."""
    token_dispatcher: str = "auto"
    """How tokens reach their experts' ranks: ``allgather`` (each expert-parallel rank gathers
    every token of its EP x expert-TP group; runs on gloo), ``alltoall`` (each token goes only
    where it is routed; needs NCCL: gloo has no ``all_to_all_single`` with splits), ``auto``
    (alltoall with NCCL, allgather with gloo)."""
    expert_capacity_factor: float | None = None
    """Megatron token dropping: each expert takes at most ``factor * tokens * top_k /
    num_experts`` assignments per micro-batch (lowest router probabilities dropped). None:
    nothing is dropped, as in the HF models and vLLM."""

    grouped_gemm: bool = True
    """Compute a rank's routed experts as one grouped GEMM per projection
    (`verl_mp.models.grouped_experts`: ``torch._grouped_mm``, CUTLASS on Hopper for bf16) instead
    of megatron's loop of one small MLP per expert (SequentialMLP). Same parameters, checkpoint
    keys and math; bf16 on GPUs (other GPU dtypes keep the loop); false runs megatron's loop
    (the reference path)."""

    expert_bias_update_rate: float = 0.0
    """Sigmoid routers with an expert bias (DeepSeek-V3's ``e_score_correction_bias``): after
    each step megatron moves every expert's bias by this much towards balance (``+rate`` if the
    expert got fewer than the mean tokens over the step's data-parallel batch, ``-rate`` if
    more). 0 keeps the checkpoint's bias, so routing changes only through the trained
    weights (old and new log-probs route alike). Ignored by softmax routers."""

    def __post_init__(self) -> None:
        if self.token_dispatcher not in TOKEN_DISPATCHERS:
            raise ValueError(f"moe.token_dispatcher={self.token_dispatcher!r} is not one of {TOKEN_DISPATCHERS}")
        for name in ("aux_loss_coeff", "z_loss_coeff", "expert_bias_update_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"moe.{name}={getattr(self, name)} must be >= 0")
        if self.expert_capacity_factor is not None and self.expert_capacity_factor <= 0:
            raise ValueError(f"moe.expert_capacity_factor={self.expert_capacity_factor} must be > 0 or null")
