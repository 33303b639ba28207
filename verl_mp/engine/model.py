"""Build megatron GPTModel chunks for this rank from a `GPTSpec`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_mp.config.moe import MoEConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.moe import moe_config_kwargs, resolve_dispatcher
from verl_mp.engine.runtime import ParallelState, has_cuda, megatron_scope
from verl_mp.engine.value_head import ValueHead
from verl_mp.models.layer_spec import decoder_block_spec
from verl_mp.models.rope import rope_inv_freq
from verl_mp.models.spec import GPTSpec, padded_vocab_size
from verl_mp.patches import megatron_mla, megatron_moe, megatron_router_bias
from verl_mp.utils.dtypes import TORCH_DTYPES


def recompute_settings(mode: str, modules: list[str] = ("mlp",), num_layers: int = 1) -> dict:
    """TransformerConfig keywords for activation recompute ``none``/``selective``/``full``."""
    if mode == "none":
        return {}
    if mode == "selective":
        return dict(recompute_granularity="selective", recompute_modules=list(modules))
    return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=num_layers)


def transformer_config(spec: GPTSpec, parallel: ParallelConfig, dtype: str = "fp32", *,
                       moe: MoEConfig | None = None, swiglu_module: bool = False, **overrides):
    """The megatron TransformerConfig for ``spec`` under ``parallel`` (``moe``: router settings
    of a mixture-of-experts model, defaults when None).

    ``swiglu_module`` (the ``sdpa`` layer spec): a gated model's MLPs (dense, routed and shared
    experts) apply the spec's activation module (`verl_mp.kernels.layers.SwiGLU`) to the whole
    fc1 output, which megatron does under ``use_te_activation_func`` (its name; no
    transformer-engine needed). The spec must then give every MLP that module.

    Fusions that need apex/transformer-engine kernels are off; the model math is the
    same as with them (they fuse, they do not approximate).
    """
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    torch_dtype = TORCH_DTYPES[dtype]
    moe = moe or MoEConfig()
    moe_kwargs = moe_config_kwargs(spec, moe, resolve_dispatcher(moe.token_dispatcher)) if spec.moe else {}
    # megatron's allgather dispatcher refuses variable_seq_lengths: the engine then pads all
    # micro-batches to one shape (MegatronEngine._micro_batches).
    variable = parallel.pipeline_model_parallel_size > 1 and moe_kwargs.get("moe_token_dispatcher_type") != "allgather"
    kwargs = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        ffn_hidden_size=spec.ffn_hidden_size,
        kv_channels=spec.head_dim,
        layernorm_epsilon=spec.norm_epsilon,
        normalization="RMSNorm",
        gated_linear_unit=spec.gated_linear_unit,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.add_qkv_bias,
        qk_layernorm=spec.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=parallel.expert_tp_size,
        sequence_parallel=parallel.sequence_parallel,
        # Micro-batches may differ in shape (token-budget batching, packed sequences):
        # pipeline stages exchange shapes before activations.
        variable_seq_lengths=variable,
        # Unused by dense models, but megatron 0.16 rejects variable_seq_lengths with the
        # default "allgather" MoE dispatcher even when there are no experts.
        moe_token_dispatcher_type="alltoall",
        # HF sliding window: a query at i sees keys j with i - j < W (megatron: left W-1).
        window_size=(spec.sliding_window - 1, 0) if spec.sliding_window else None,
        params_dtype=torch_dtype,
        pipeline_dtype=torch_dtype,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        use_cpu_initialization=not has_cuda(),
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # Losses arrive already normalised by global token/sequence counts (algo.agg_loss),
        # so micro-batch and data-parallel contributions must be summed, not averaged.
        calculate_per_token_loss=True,
        use_te_activation_func=swiglu_module and spec.gated_linear_unit,
    )
    kwargs.update(moe_kwargs)
    kwargs.update(mla_config_kwargs(spec))
    kwargs.update(overrides)
    return (MLATransformerConfig if spec.mla else TransformerConfig)(**kwargs)


def mla_config_kwargs(spec: GPTSpec) -> dict:
    """MLATransformerConfig fields for ``spec.mla`` (empty without multi-latent attention)."""
    if spec.mla is None:
        return {}
    m = spec.mla
    if m.yarn is None:
        # a scaling factor of 1 makes megatron's softmax scale 1/sqrt(q_head_dim), as HF's without YaRN
        rope = dict(rope_type="rope", rotary_scaling_factor=1.0)
    else:  # megatron's YarnRotaryEmbedding and MLA softmax scale (hf_config maps HF's parameters onto them)
        y = m.yarn
        rope = dict(rope_type="yarn", rotary_scaling_factor=y.factor,
                    original_max_position_embeddings=y.original_max_position_embeddings,
                    beta_fast=y.beta_fast, beta_slow=y.beta_slow, mscale=y.mscale, mscale_all_dim=y.mscale_all_dim)
    return dict(
        multi_latent_attention=True, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_nope_head_dim, qk_pos_emb_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
        rotary_base=spec.rotary_base, **rope,
        # megatron's local MLA spec adds the q/kv latent norms only with qk_layernorm.
        qk_layernorm=True,
    )


def build_gpt_chunks(spec: GPTSpec, config, state: ParallelState, layer_spec=None,
                     backend: str = "local", grouped_experts: bool = False) -> list:
    """One GPTModel per virtual pipeline chunk on this rank (one chunk without VPP).

    ``backend`` picks the layer spec (`verl_mp.models.layer_spec`) unless ``layer_spec`` is
    given. Rotary frequencies follow ``spec``'s rope type (`verl_mp.models.rope`); with
    ``spec.value_head`` the output layer is a `ValueHead` (critic). ``grouped_experts``: MoE
    layers compute their experts as grouped GEMMs (`verl_mp.models.grouped_experts`).
    """
    from megatron.core import parallel_state as mps
    from megatron.core.models.gpt import GPTModel

    if spec.moe is not None:
        megatron_moe.install()
        megatron_router_bias.install()
    if spec.mla is not None:
        megatron_mla.install()
    chunks = []
    with megatron_scope():
        for vp_stage in range(state.vpp_size or 1):
            vp = vp_stage if state.vpp_size else None
            chunks.append(
                GPTModel(
                    config=config,
                    transformer_layer_spec=layer_spec or decoder_block_spec(spec, config, backend, vp, grouped_experts),
                    vocab_size=padded_vocab_size(spec.vocab_size, state.tp_size),
                    max_sequence_length=spec.max_position_embeddings,
                    pre_process=mps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                    post_process=mps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                    share_embeddings_and_output_weights=spec.tie_word_embeddings and not spec.value_head,
                    position_embedding_type="rope",
                    rotary_base=int(spec.rotary_base),
                    vp_stage=vp,
                )
            )
    for chunk in chunks:
        _finish_chunk(chunk, spec, config)
    device = torch.device("cuda", torch.cuda.current_device()) if has_cuda() else None
    if device is not None:
        chunks = [c.to(device) for c in chunks]
    return chunks


def _finish_chunk(chunk, spec: GPTSpec, config) -> None:
    # megatron's RotaryEmbedding hard-codes Llama-3.1 constants; use the checkpoint's.
    # Multi-latent attention has one rotary embedding per layer, over the rope dimension.
    if spec.mla is None:
        chunk.rotary_pos_emb.inv_freq = rope_inv_freq(spec)
    elif spec.mla.yarn is None:  # megatron's YarnRotaryEmbedding computes its own frequencies
        for layer in chunk.decoder.layers:
            layer.self_attention.rotary_pos_emb.inv_freq = rope_inv_freq(spec)
    if spec.value_head and chunk.post_process:
        chunk.output_layer = ValueHead(config)


def wrap_ddp(chunks: list, config, use_distributed_optimizer: bool = True) -> list:
    """Wrap chunks in megatron DDP (contiguous fp32 grad buffers, bucketed reduction)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=use_distributed_optimizer,
        overlap_grad_reduce=False,
    )
    with megatron_scope():
        return [
            DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                    disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)
        ]
