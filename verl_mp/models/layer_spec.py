"""Transformer layer specs: transformer-engine's when importable, else the project's own.

Backends (``EngineConfig.attention_backend``):

- ``te``: megatron's transformer-engine spec (fused kernels, packed sequences, SP).
- ``sdpa``: megatron's local linears with `SDPAttention` (torch
  ``scaled_dot_product_attention``; flash/efficient kernels on GPU, packed THD sequences
  supported), `RMSNorm` (supports sequence parallelism, HF-exact in bf16) and
  `verl_mp.kernels.layers.SwiGLU` as the activation of every MLP (dense, routed and shared
  experts); on CUDA the norm and the activation are fused Triton ops
  (`verl_mp.kernels.layers`), elsewhere plain torch.
- ``local``: megatron's stock local spec (unfused attention, torch norms; no packed
  sequences, no sequence parallelism). Kept as the reference the others are tested against.
- ``auto``: ``te`` if transformer-engine imports, else ``sdpa``.

Multi-latent attention (DeepSeek-V3, ``GPTSpec.mla``) is ``sdpa`` only: megatron's
``MLASelfAttention`` with the submodules of its local MLA spec (``get_gpt_layer_local_spec(...,
multi_latent_attention=True)``: column-parallel up projections, latent norms) except the core
attention, `SDPAttention`, the norms, `RMSNorm`, and the down projections, replicated on the
TP ranks (`_own_attention_spec` says why). megatron's local ``DotProductAttention``
cannot serve MLA (no separate key/value head sizes), so ``local`` refuses it, and ``te``
refuses every MoE model. A model whose first layers are dense (``moe.first_dense_layers``)
gets one layer spec per layer.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from verl_mp.kernels.layers import SwiGLU, rms_norm
from verl_mp.models.spec import GPTSpec

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "te", "sdpa", "local")


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"attention_backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "te" if have_transformer_engine() else "sdpa"
    if backend == "te" and not have_transformer_engine():
        raise ValueError("attention_backend='te' needs transformer-engine; install it or use 'sdpa'")
    return backend


class RMSNorm(torch.nn.Module):
    """RMSNorm computed in fp32 and cast back before the weight (as HF Llama/Qwen do).

    The weight is marked ``sequence_parallel`` when the config enables it, so megatron's
    grad finalisation all-reduces its gradient over the TP group (each rank then saw
    only its slice of the sequence).
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., hidden]`` -> same shape and dtype (fused Triton op on CUDA: `kernels.layers`)."""
        return rms_norm(x, self.weight, self.eps)


class SDPAttention(torch.nn.Module):
    """Core attention with torch ``scaled_dot_product_attention`` (megatron's interface).

    Inputs: ``query [sq, b, np, hn]``, ``key``/``value`` ``[sk, b, ng, hn]`` (this rank's
    heads; GQA via ``enable_gqa``), or ``[t, heads, hn]`` with THD ``packed_seq_params``.
    Output: ``[sq, b, np * hn]`` (``[t, np * hn]`` for THD). Causal; honours
    ``config.window_size`` (sliding window) and an optional boolean ``attention_mask``
    (True = masked, megatron convention).
    """

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type=None, pg_collection=None, k_channels: int | None = None,
                 v_channels: int | None = None):
        # k_channels/v_channels (multi-latent attention: query/key and value head sizes
        # differ) need nothing here: SDPA takes the sizes from the tensors.
        super().__init__()
        if config.context_parallel_size != 1:
            raise ValueError("context_parallel_size > 1 needs attention_backend='te'")
        self.config = config
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.window = config.window_size

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if attention_bias is not None:
            raise ValueError("attention_bias is not supported by SDPAttention")
        if packed_seq_params is not None:
            return self._forward_packed(query, key, value, packed_seq_params)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        mask = self._mask(q.shape[2], k.shape[2], attention_mask, q.device)
        out = self._sdpa(q, k, v, mask)
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)

    def _sdpa(self, q, k, v, mask):
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None,
            scale=self.scale, enable_gqa=k.shape[1] != q.shape[1],
        )

    def _mask(self, sq: int, sk: int, attention_mask, device):
        """Boolean keep-mask ``[.., sq, sk]``, or None for plain causal attention."""
        if self.window is None and attention_mask is None:
            return None
        i = torch.arange(sq, device=device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=device)[None, :]
        keep = j <= i
        if self.window is not None:
            keep = keep & (j >= i - self.window[0])
        if attention_mask is not None:
            keep = keep & ~attention_mask
        return keep

    def _forward_packed(self, query, key, value, params):
        """THD: one causal attention per packed sequence (no cross-sequence attention)."""
        if params.qkv_format != "thd":
            raise ValueError(f"SDPAttention supports qkv_format='thd' only, got {params.qkv_format!r}")
        cu = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        bounds = cu.tolist()
        outs = []
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            q, k, v = (t[start:stop].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            mask = self._mask(stop - start, stop - start, None, q.device)
            outs.append(self._sdpa(q, k, v, mask)[0].transpose(0, 1))  # [L, np, hn]
        out = torch.cat(outs, dim=0) if outs else query.new_zeros(query.shape)
        return out.reshape(out.shape[0], -1)


def _own_attention_spec(spec: GPTSpec):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    if spec.mla is not None:
        from megatron.core.post_training.modelopt.layers import Linear
        from megatron.core.transformer.multi_latent_attention import (
            MLASelfAttention,
            MLASelfAttentionSubmodules,
        )

        # The down projections are replicated on the TP ranks (megatron's plain ``Linear``, as
        # TE's MLA spec does with ``TELinear(parallel_mode="duplicated")``), not column-parallel
        # as in megatron's local MLA spec: there, at TP > 1, the shared rotary key ``k_pos_emb``
        # is all-gathered from the column shards and its gradient only split back, so each rank
        # keeps its own heads' part and the rest is lost (megatron-core 0.16.1; a train step at
        # TP2 then differs from TP1). Replicated, under sequence parallelism, k_pos_emb is
        # gathered over the sequence instead, whose backward sums the ranks' parts.
        return ModuleSpec(module=MLASelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                          submodules=MLASelfAttentionSubmodules(
                              linear_q_proj=ColumnParallelLinear, linear_q_down_proj=Linear,
                              linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=Linear,
                              linear_kv_up_proj=ColumnParallelLinear, core_attention=SDPAttention,
                              linear_proj=RowParallelLinear, q_layernorm=RMSNorm, kv_layernorm=RMSNorm))
    qk_norm = RMSNorm if spec.qk_layernorm else IdentityOp
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=ColumnParallelLinear, core_attention=SDPAttention,
            linear_proj=RowParallelLinear, q_layernorm=qk_norm, k_layernorm=qk_norm,
        ),
    )


def _own_layer_spec(spec: GPTSpec, moe_layer: bool, swiglu_module: bool = False, grouped_experts: bool = False):
    """One decoder layer of the ``sdpa`` backend; ``moe_layer``: the MoE MLP, else a dense one.

    ``swiglu_module`` (``config.use_te_activation_func``, see `verl_mp.engine.model`): the
    MLP's activation (every expert's in a MoE layer) is `verl_mp.kernels.layers.SwiGLU` (fused
    on CUDA) instead of megatron's chunk-silu-multiply.
    """
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    mlp = _moe_mlp_spec(spec, swiglu_module, grouped_experts) if moe_layer else ModuleSpec(
        module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear,
                                             activation_func=SwiGLU if swiglu_module else None))
    attention = _own_attention_spec(spec)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm, self_attention=attention, self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
            # Same checkpoint keys as megatron's local/TE specs: checkpoints stay interchangeable.
            sharded_state_dict_keys_map={
                "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
            },
        ),
    )


def _moe_mlp_spec(spec: GPTSpec, swiglu_module: bool = False, grouped_experts: bool = False):
    """megatron's MoELayer with local linears: TopKRouter, SequentialMLP experts (one MLP per
    local expert; `GroupedExperts` with ``grouped_experts``: the same parameters as grouped
    GEMMs), and a SharedExpertMLP when the model has one; with ``swiglu_module`` every expert's
    (and the shared expert's) activation is `SwiGLU`."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend

    class SwiGLUSpecProvider(LocalSpecProvider):
        def activation_func(self):
            return SwiGLU

    provider = SwiGLUSpecProvider() if swiglu_module else LocalSpecProvider()
    moe_spec = get_moe_module_spec_for_backend(provider, num_experts=spec.moe.num_experts, moe_grouped_gemm=False)
    return with_grouped_experts(moe_spec) if grouped_experts else moe_spec


def with_grouped_experts(layer_spec):
    """``layer_spec`` (a MoE MLP's, a decoder layer's, or a block's of either) with its
    SequentialMLP experts replaced by `GroupedExperts` (same parameters), in place."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    from verl_mp.models.grouped_experts import GroupedExperts  # lazy: imports megatron, like this function

    specs = layer_spec.layer_specs if hasattr(layer_spec, "layer_specs") else [layer_spec]
    for one in specs:
        mlp = getattr(one.submodules, "mlp", one)  # a decoder layer's MLP, or a MoE MLP's spec itself
        experts = getattr(getattr(mlp, "submodules", None), "experts", None)
        if experts is not None and experts.module is SequentialMLP:
            experts.module = GroupedExperts
    return layer_spec


def decoder_block_spec(spec: GPTSpec, config, backend: str, vp_stage: int | None = None,
                       grouped_experts: bool = False):
    """The ``transformer_layer_spec`` argument of GPTModel for this rank's chunk
    (``grouped_experts``: MoE layers run `GroupedExperts`)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    backend = resolve_backend(backend)
    if backend == "te" and spec.moe is not None:
        raise ValueError("mixture-of-experts models are not supported with attention_backend='te' yet "
                         "(its grouped experts have another parameter layout); use 'sdpa'")
    if backend == "te":
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_layernorm)
    if backend == "local":
        if config.sequence_parallel:
            raise ValueError("sequence_parallel=True needs attention_backend 'sdpa' or 'te' "
                             "(megatron's torch norm of the 'local' backend refuses it)")
        if spec.mla is not None:
            raise ValueError("attention_backend='local' cannot build multi-latent attention: megatron-core "
                             "0.16.1's local DotProductAttention takes no k_channels/v_channels (its MLA "
                             "spec needs transformer-engine's attention); use 'sdpa'")
        if spec.moe is not None and spec.moe.first_dense_layers:
            # megatron's per-layer local specs: moe_layer_freq picks dense or MoE per layer
            block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm",
                                               vp_stage=vp_stage)
            return with_grouped_experts(block) if grouped_experts else block
        layer = get_gpt_layer_local_spec(num_experts=spec.moe.num_experts if spec.moe else None,
                                         moe_grouped_gemm=False, qk_layernorm=spec.qk_layernorm)
        return with_grouped_experts(layer) if grouped_experts else layer
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    layers = range(offset, offset + get_num_layers_to_build(config, vp_stage=vp_stage))
    specs = [_own_layer_spec(spec, moe_layer=spec.moe is not None and spec.moe.is_moe_layer(i),
                             swiglu_module=config.use_te_activation_func, grouped_experts=grouped_experts)
             for i in layers]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=RMSNorm)
