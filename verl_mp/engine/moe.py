"""Mixture-of-experts pieces of the engine: megatron MoE settings, router-loss scaling, metrics.

- `moe_config_kwargs`: the TransformerConfig fields that make megatron's router compute what
  the HF model computes (softmax over all experts in fp32, top-k, optional renormalisation;
  Qwen2-MoE's sigmoid-gated shared expert) and pick the token dispatcher.
- `RouterLossScale`: megatron scales the load-balancing and z-loss gradients for its own
  per-token normalisation, which the engine does not use (losses arrive normalised by
  global counts, gradients are summed; `verl_mp.engine.schedule`). Rescaled coefficients per
  micro-batch and rank make them exactly ``coeff`` x the token-weighted mean over the step
  (`RouterLossScale`); padding is excluded (megatron's ``padding_mask``).
- `RouterStats`: forward hooks on the routers count, over real (non-padding) tokens, the
  assignments per expert and layer, the dropped ones, and the router probabilities; after a
  step they become scalar metrics (`RouterStats.metrics`).
- Routing replay and recording (`verl_mp.engine.routing_replay`), set per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_mp.config.moe import MoEConfig
from verl_mp.engine.batching import dummy_like, pad_model_inputs
from verl_mp.engine.layout import unwrap
from verl_mp.engine.routing_replay import RoutingReplay
from verl_mp.engine.runtime import local_device
from verl_mp.models.spec import GPTSpec


def resolve_dispatcher(name: str) -> str:
    """``auto`` -> ``alltoall`` on NCCL, ``allgather`` on gloo; ``alltoall`` on gloo is refused."""
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if name == "auto":
        return "alltoall" if backend == "nccl" else "allgather"
    if name == "alltoall" and backend == "gloo":
        raise ValueError("moe.token_dispatcher='alltoall' needs NCCL (gloo has no all_to_all_single with "
                         "splits); use 'allgather' or 'auto' on CPU")
    return name


def moe_config_kwargs(spec: GPTSpec, moe: MoEConfig, dispatcher: str) -> dict:
    """TransformerConfig fields for ``spec.moe`` (empty for a dense model)."""
    if spec.moe is None:
        return {}
    m = spec.moe
    if m.score_function == "softmax" and m.top_k == 1 and m.norm_topk_prob:
        # megatron needs softmax before top-1; the renormalised HF weight would be exactly 1.
        raise ValueError(f"{spec.architecture}: top-1 routing with norm_topk_prob=true is not supported")
    return dict(
        num_moe_experts=m.num_experts,
        moe_ffn_hidden_size=m.ffn_hidden_size,
        moe_router_topk=m.top_k,
        # HF: softmax over all experts, top-k, renormalise if norm_topk_prob. megatron's
        # "top-k of the logits, then softmax over the k" is that renormalised softmax;
        # pre-softmax (softmax over all, then top-k) is the un-renormalised one. (Sigmoid
        # routing ignores it: megatron renormalises for k > 1, as hf_config requires.)
        moe_router_pre_softmax=not m.norm_topk_prob,
        moe_router_score_function=m.score_function,
        moe_router_enable_expert_bias=m.expert_bias,
        moe_router_bias_update_rate=moe.expert_bias_update_rate,
        moe_router_topk_scaling_factor=m.scaling_factor,
        moe_router_num_groups=m.num_groups,
        moe_router_group_topk=m.group_topk,
        # 0 = dense MLP, 1 = MoE, per layer (DeepSeek-V3's first dense layers)
        moe_layer_freq=[int(m.is_moe_layer(i)) for i in range(spec.num_layers)],
        moe_router_dtype="fp32",
        moe_shared_expert_intermediate_size=m.shared_expert_ffn_hidden_size,
        moe_shared_expert_gate=m.shared_expert_gate,
        moe_token_dispatcher_type=dispatcher,
        moe_grouped_gemm=False,
        moe_expert_capacity_factor=moe.expert_capacity_factor,
        moe_router_load_balancing_type="aux_loss" if moe.aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=0.0,  # set per micro-batch by RouterLossScale
        moe_z_loss_coeff=None,
    )


@dataclass
class RouterLossScale:
    """Per-micro-batch router-loss coefficients (see the module doc).

    megatron-core 0.16.1 computes, per micro-batch and rank, the load-balancing loss of its
    router-input slice (sequence parallelism: 1/TP of the tokens, normalised by the TP
    group's token count, so the slices' losses sum to the micro-batch's) and the z-loss mean
    over its slice divided by TP, and scales their gradients for its per-token mode: the
    z-loss by the slice's real tokens, the load-balancing loss by the real tokens of the
    whole TP group (``get_tokens_per_expert_and_token_count`` all-reduces its "local" count
    in place). With ``N`` real tokens in the step and ``sp`` = TP under sequence parallelism
    (else 1), the coefficients ``aux / N`` and ``z * sp / N`` then make the gradient exactly
    ``aux`` x (token-weighted mean of the micro-batches' load-balancing losses) + ``z`` x
    (mean z-loss over the step's tokens), at any layout (tests/dist/test_engine_moe.py
    compares TP2 + SP against one rank).
    """

    moe: MoEConfig
    sp_factor: int
    step_tokens: int = 0
    """Real tokens of the step (all data-parallel ranks)."""

    def apply(self, config, active: bool = False) -> None:
        """Set ``config``'s coefficients for the next micro-batch (0 when not ``active``)."""
        scale = 1.0 / self.step_tokens if active and self.step_tokens > 0 else 0.0
        config.moe_aux_loss_coeff = self.moe.aux_loss_coeff * scale
        z = self.moe.z_loss_coeff * self.sp_factor * scale
        config.moe_z_loss_coeff = z if z > 0 else None


def moe_routers(chunks: list) -> list[tuple[int, torch.nn.Module]]:
    """``(global layer index, router)`` of every MoE layer in this rank's chunks."""
    out = []
    for chunk in chunks:
        for layer in unwrap(chunk).decoder.layers:
            router = getattr(layer.mlp, "router", None)
            if router is not None:
                out.append((layer.layer_number - 1, router))
    return out


@dataclass
class RouterStats:
    """Per-layer routing statistics over real tokens, accumulated by router forward hooks.

    The engine calls `set_token_mask` before each micro-batch's forward with a bool mask in
    the router's token order (``[s, b]`` flattened, this rank's sequence-parallel slice) and
    None for padding micro-batches (not counted).
    """

    num_layers: int
    num_experts: int
    top_k: int
    counts: torch.Tensor = field(init=False)
    """``[num_layers, E]`` assignments per expert (after any token dropping)."""
    prob_sums: torch.Tensor = field(init=False)
    """``[num_layers, E]`` sum of the router probabilities (`router_probs`)."""
    tokens: torch.Tensor = field(init=False)
    """``[num_layers]`` routed tokens."""
    token_mask: torch.Tensor | None = None
    enabled: bool = False

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        # On the device: the hooks add to them without a host synchronisation per layer.
        self.counts = torch.zeros(self.num_layers, self.num_experts, dtype=torch.float64, device=_device())
        self.prob_sums = torch.zeros_like(self.counts)
        self.tokens = torch.zeros(self.num_layers, dtype=torch.float64, device=_device())

    def attach(self, chunks: list) -> list:
        """Register the hooks; returns their handles."""
        return [router.register_forward_hook(self._hook(layer)) for layer, router in moe_routers(chunks)]

    def set_token_mask(self, mask: torch.Tensor | None) -> None:
        self.token_mask = mask

    def _hook(self, layer: int):
        def hook(router, args, output):
            if not self.enabled or self.token_mask is None:
                return
            with torch.no_grad():
                self._record(layer, router, args[0], output[1])
        return hook

    def _record(self, layer: int, router, hidden: torch.Tensor, routing_map: torch.Tensor) -> None:
        keep = self.token_mask
        logits = torch.nn.functional.linear(hidden.reshape(-1, hidden.shape[-1]).float(), router.weight.float())
        probs = router_probs(logits, router.config.moe_router_score_function)[keep]
        self.counts[layer] += routing_map[keep].sum(dim=0).double()
        self.prob_sums[layer] += probs.sum(dim=0).double()
        self.tokens[layer] += keep.sum()

    def metrics(self, sequence_parallel: bool) -> dict[str, float]:
        """Reduce over DP, PP and (under sequence parallelism) TP, and summarise; collective,
        every rank gets the same values.

        - ``moe/load_balancing_loss``: mean over layers of ``E * sum_i f_i * P_i`` on the step's
          tokens (1.0 when perfectly balanced; the quantity ``moe.aux_loss_coeff`` weighs, here
          over the whole step instead of per micro-batch and without padding);
        - ``moe/tokens_per_expert_max`` / ``_mean``: max and mean over layers and experts of the
          assignments per expert; ``moe/max_over_mean_load``: the largest per-layer max/mean;
        - ``moe/dropped_tokens``: top-k assignments dropped by the capacity factor (0 without).
        """
        from megatron.core import parallel_state as mps

        stacked = torch.cat([self.counts, self.prob_sums, self.tokens[:, None]], dim=1)
        groups = [mps.get_data_parallel_group(), mps.get_pipeline_model_parallel_group()]
        if sequence_parallel:
            groups.append(mps.get_tensor_model_parallel_group())  # each TP rank saw its own slice
        for group in groups:
            dist.all_reduce(stacked, group=group)
        stacked = stacked.cpu()
        e = self.num_experts
        counts, prob_sums, tokens = stacked[:, :e], stacked[:, e:2 * e], stacked[:, 2 * e]
        self.reset()
        return summarise(counts, prob_sums, tokens, self.top_k)


def router_probs(logits: torch.Tensor, score_function: str) -> torch.Tensor:
    """``[tokens, E]`` probabilities the load-balancing loss weighs, as megatron computes them:
    softmax, or sigmoid scores normalised to sum to 1 per token."""
    if score_function == "sigmoid":
        scores = torch.sigmoid(logits)
        return scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    return torch.softmax(logits, dim=-1)


def summarise(counts: torch.Tensor, prob_sums: torch.Tensor, tokens: torch.Tensor, top_k: int) -> dict[str, float]:
    """Scalar metrics from per-layer ``counts``/``prob_sums`` ``[L, E]`` and ``tokens`` ``[L]``."""
    seen = tokens > 0
    if not bool(seen.any()):
        return {}
    counts, prob_sums, tokens = counts[seen], prob_sums[seen], tokens[seen]
    num_experts = counts.shape[1]
    f = counts / (tokens[:, None] * top_k)
    p = prob_sums / tokens[:, None]
    mean = counts.mean(dim=1)
    return {
        "moe/load_balancing_loss": float((num_experts * (f * p).sum(dim=1)).mean()),
        "moe/tokens_per_expert_max": float(counts.max()),
        "moe/tokens_per_expert_mean": float(mean.mean()),
        "moe/max_over_mean_load": float((counts.max(dim=1).values / mean.clamp(min=1e-12)).max()),
        "moe/dropped_tokens": float((tokens * top_k - counts.sum(dim=1)).sum()),
    }


def _device() -> torch.device:
    return local_device()


class MoERuntime:
    """What a MoE engine does around each step: equal micro-batch counts/shapes on the ranks
    whose tokens meet in the MoE layers, per-micro-batch router state, routing metrics."""

    def __init__(self, spec: GPTSpec, moe: MoEConfig, tf_config, chunks: list, state):
        self.state, self.config = state, tf_config
        self.sequence_parallel = bool(tf_config.sequence_parallel)
        # allgather needs every micro-batch of the EP x expert-TP group (and, without
        # variable_seq_lengths, of the pipeline) to have one shape; alltoall only one count.
        self.exchange = state.ep_size * state.etp_size > 1 and state.dp_size > 1
        self.same_shape = tf_config.moe_token_dispatcher_type == "allgather" and (self.exchange or state.pp_size > 1)
        self.loss_scale = RouterLossScale(moe, state.tp_size if self.sequence_parallel else 1)
        self.stats = RouterStats(spec.num_layers, spec.moe.num_experts, spec.moe.top_k)
        self._hooks = self.stats.attach(chunks)
        self.replay = RoutingReplay(moe_routers(chunks), spec.num_layers, spec.moe.top_k, state,
                                    self.sequence_parallel)

    def align(self, mbs: list) -> list:
        """Pad ``mbs`` (and append padding micro-batches) so every rank of an MoE token
        exchange runs the same micro-batches; returns the new list."""
        from megatron.core import parallel_state as mps

        shapes = [tuple(mb.model_inputs["input_ids"].shape) for mb in mbs]
        plan = torch.tensor([len(mbs), max(b for b, _ in shapes), max(s for _, s in shapes)], device=_device())
        if self.exchange:
            dist.all_reduce(plan, op=dist.ReduceOp.MAX, group=mps.get_data_parallel_group())
        count, rows, width = plan.tolist()
        if self.same_shape:
            mbs = [pad_model_inputs(mb, rows, width) for mb in mbs]
        return mbs + [dummy_like(mbs[-1]) for _ in range(count - len(mbs))]

    def start_step(self, attention_mask: torch.Tensor) -> None:
        """Before a train step on the full ``[B, S]`` batch: the step's real-token count (for
        the router losses) and start recording routing stats."""
        self.loss_scale.step_tokens = int(attention_mask.sum())
        self.stats.enabled = True

    def end_step(self) -> dict[str, float]:
        """Stop recording; the step's routing metrics (collective)."""
        self.stats.enabled = False
        self.loss_scale.step_tokens = 0
        self.loss_scale.apply(self.config)
        return self.stats.metrics(self.sequence_parallel)

    def on_forward(self, batch: dict, model) -> dict:
        """Before a micro-batch's forward on one chunk: router-loss coefficients, the stats'
        token mask; returns the model's ``padding_mask`` argument (True on padding)."""
        mb = batch["_mb"]
        keep = mb.model_token_mask()  # [rows, width], model-input layout
        local = self._sp_slice(keep.t())  # [width (/TP), rows]: the routers' token order
        self.loss_scale.apply(self.config, active=not mb.dummy)
        self.stats.set_token_mask(None if mb.dummy else local.reshape(-1))
        self.replay.on_forward(mb)
        # GPTModel scatters the mask over sequence-parallel ranks only on the first stage
        # (megatron-core 0.16.1 _preprocess); later stages must get their slice already.
        first = unwrap(model).pre_process
        return {"padding_mask": ~(keep if first or not self.sequence_parallel else local.t())}

    def _sp_slice(self, seq_major: torch.Tensor) -> torch.Tensor:
        """``[s, ...]`` -> this rank's sequence-parallel part (unchanged without SP)."""
        if not self.sequence_parallel:
            return seq_major
        return seq_major.chunk(self.state.tp_size, dim=0)[self.state.tp_rank]
