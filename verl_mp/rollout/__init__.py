"""Rollout backends: vLLM (`vllm_rollout`, the default), SGLang (`sglang_rollout`, CUDA only) and
HF transformers (`hf_rollout`, a slow fallback), behind one interface (`types.RolloutBackend`)."""

from __future__ import annotations

from verl_mp.config.rollout import RolloutConfig


def build_rollout(cfg: RolloutConfig, model_path: str, num_kv_heads: int, moe: bool = False,
                  record_routing: bool = False, max_positions: int | None = None):
    """The backend ``cfg.backend`` names, started on this process (collective); ``moe``: the
    model has routed experts; ``record_routing``: generation can record them (vLLM only);
    ``max_positions``: the model's ``max_position_embeddings`` (SGLang's context stays within it)."""
    if cfg.backend == "vllm":
        from verl_mp.rollout.vllm_rollout import VLLMRollout  # lazy: vLLM, seconds to import

        return VLLMRollout(cfg, model_path, num_kv_heads, moe=moe, record_routing=record_routing)
    if record_routing:
        raise ValueError("routing capture needs rollout.backend=vllm")
    if cfg.multi_turn.enable:
        raise ValueError("rollout.multi_turn.enable=true needs rollout.backend=vllm")
    if cfg.backend == "sglang":
        from verl_mp.rollout.sglang_rollout import SGLangRollout  # lazy: SGLang's engine

        return SGLangRollout(cfg, model_path, num_kv_heads, moe=moe, max_positions=max_positions)
    from verl_mp.rollout.hf_rollout import HFRollout  # lazy: transformers' models

    return HFRollout(cfg, model_path)
