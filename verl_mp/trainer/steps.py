"""The pure parts of one RL step: packing, rewards -> advantages, and step metrics.

No processes, no engines: tensors and configs in, tensors and metrics out.
"""

from __future__ import annotations

import torch

from verl_mp.algo import (
    ADVANTAGE_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    explained_variance,
)
from verl_mp.config.schema import AlgorithmConfig, RootConfig, critic_enabled
from verl_mp.data.batch import PromptBatch
from verl_mp.data.rl_batch import RLBatch
from verl_mp.rollout.types import RolloutOutput

# Which batch fields each built-in estimator needs, besides rewards and the mask.
_ESTIMATOR_INPUTS = {
    "gae": ("values",),
    "grpo": ("group_ids",),
    "rloo": ("group_ids",),
    "reinforce_plus_plus": (),
    "reinforce_plus_plus_baseline": ("group_ids",),
    "remax": ("baseline_rewards",),
}


def needs_critic(cfg: RootConfig) -> bool:
    return critic_enabled(cfg)


def needs_reference(cfg: RootConfig) -> bool:
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def build_batch(prompts: PromptBatch, out: RolloutOutput, pad_token_id: int) -> RLBatch:
    batch = RLBatch.from_samples(prompts.input_ids, out.response_ids, out.n, pad_token_id,
                                 prompts.ground_truths, prompts.data_sources)
    batch.rollout_log_probs = out.padded_logprobs(batch.responses.shape[1]) * batch.response_mask
    return batch


def make_kl_controller(algo: AlgorithmConfig):
    ctrl = algo.kl_ctrl
    if ctrl.type == "fixed":
        return FixedKLController(ctrl.kl_coef)
    if ctrl.type == "adaptive":
        return AdaptiveKLController(ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
    raise ValueError(f"algorithm.kl_ctrl.type={ctrl.type!r} must be 'fixed' or 'adaptive'")


def compute_rewards(batch: RLBatch, algo: AlgorithmConfig, kl_ctrl) -> dict[str, float]:
    """token_level_rewards = scores (- KL penalty when algorithm.use_kl_in_reward)."""
    batch.require("token_level_scores")
    if not algo.use_kl_in_reward:
        batch.token_level_rewards = batch.token_level_scores
        return {}
    batch.require("old_log_probs", "ref_log_probs")
    rewards, m = apply_kl_penalty(batch.token_level_scores, batch.old_log_probs, batch.ref_log_probs,
                                  batch.response_mask, kl_coef=kl_ctrl.value, estimator=algo.kl_penalty)
    batch.token_level_rewards = rewards
    kl_ctrl.update(float(m["kl"]), len(batch))
    return {"actor/reward_kl_penalty": float(m["kl"]), "actor/reward_kl_coef": float(m["kl_coef"])}


def compute_advantages(batch: RLBatch, algo: AlgorithmConfig, baseline_rewards: torch.Tensor | None = None) -> None:
    """Fill ``advantages`` and ``returns`` with the configured estimator (fp32).

    ``baseline_rewards`` [B]: ReMax's greedy-response rewards (only for remax)."""
    name = algo.adv_estimator
    fn = ADVANTAGE_ESTIMATORS[name]  # a registered name or a 'module:function' plugin
    kwargs = dict(token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask)
    for field_name in _ESTIMATOR_INPUTS.get(name, ("group_ids",)):
        kwargs[field_name] = baseline_rewards if field_name == "baseline_rewards" else getattr(batch, field_name)
    if name == "gae":
        kwargs.update(gamma=algo.gamma, lam=algo.lam)
    elif name == "grpo":
        kwargs.update(norm_by_std=algo.norm_adv_by_std_in_grpo)
    elif name == "reinforce_plus_plus":
        kwargs.update(gamma=algo.gamma)
    batch.advantages, batch.returns = fn(**kwargs)


def response_metrics(batch: RLBatch, out: RolloutOutput) -> dict[str, float]:
    lengths = batch.response_lengths.float()
    scores = (batch.token_level_scores * batch.response_mask).sum(-1) if batch.token_level_scores is not None else None
    m = {
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": 1.0 - sum(out.finished) / max(len(out.finished), 1),
        "prompt_length/mean": batch.prompt_lengths.float().mean().item(),
    }
    if scores is not None:
        m["critic/score/mean"] = scores.mean().item()
    return m


def logprob_gap_metrics(batch: RLBatch) -> dict[str, float]:
    """|rollout log-prob - trainer old log-prob| over real response tokens."""
    batch.require("rollout_log_probs", "old_log_probs")
    mask = batch.response_mask > 0
    if not mask.any():
        return {"rollout/logprob_diff_max": 0.0, "rollout/logprob_diff_mean": 0.0}
    diff = (batch.rollout_log_probs - batch.old_log_probs).abs()[mask]
    return {"rollout/logprob_diff_max": diff.max().item(), "rollout/logprob_diff_mean": diff.mean().item()}


def check_logprob_gap(metrics: dict[str, float], threshold: float | None, step: int) -> None:
    if threshold is not None and metrics["rollout/logprob_diff_max"] > threshold:
        raise RuntimeError(
            f"step {step}: rollout/trainer log-prob gap {metrics['rollout/logprob_diff_max']:.3g} exceeds "
            f"rollout.logprob_diff_threshold={threshold}: the weight sync or the rollout numerics "
            "disagree with the trainer (raise the threshold only if this gap is expected, e.g. bf16)"
        )


def advantage_metrics(batch: RLBatch) -> dict[str, float]:
    mask = batch.response_mask > 0
    if not mask.any():
        return {}
    adv = batch.advantages[mask]
    m = {"critic/advantages/mean": adv.mean().item(), "critic/advantages/max": adv.max().item(),
         "critic/advantages/min": adv.min().item(),
         "critic/returns/mean": batch.returns[mask].mean().item()}
    if batch.values is not None:
        m["critic/values/mean"] = batch.values[mask].mean().item()
        m["critic/explained_variance"] = explained_variance(batch.values, batch.returns, batch.response_mask).item()
    return m


def tokens_in(batch: RLBatch) -> int:
    return int((batch.prompt_lengths + batch.response_lengths).sum())


def flat_int_tensor(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64)


def flops_metrics(batch: RLBatch, seconds: float, flop_params: int, world: int, forward_passes: int,
                  train_passes: int, peak_tflops: float | None) -> dict[str, float]:
    """Estimated model FLOPs of the step: 2·P·tokens per forward pass (old/ref log-probs,
    values) and 6·P·tokens per training pass, P = parameters without the input embedding
    (attention's quadratic term is left out: an underestimate for long sequences)."""
    tokens = tokens_in(batch)
    flops = flop_params * tokens * (2 * forward_passes + 6 * train_passes)
    tflops = flops / max(seconds, 1e-9) / 1e12
    m = {"perf/tflops_per_s": tflops, "perf/tflops_per_s_per_device": tflops / world}
    if peak_tflops:
        m["perf/mfu"] = tflops / world / peak_tflops
    return m
