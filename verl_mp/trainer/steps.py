"""The pure parts of one RL step: packing, rewards -> advantages, and step metrics.

No processes, no engines: tensors and configs in, tensors and metrics out.
"""

from __future__ import annotations

import logging
import math

import torch

from verl_mp.algo import (
    ADVANTAGE_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    estimator_spec,
    explained_variance,
    rollout_correction,
)
from verl_mp.algo.rollout_correction import LOGPROB_GAP_METRICS, logprob_gap
from verl_mp.config.schema import AlgorithmConfig, RolloutCorrectionConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.rl_batch import RLBatch
from verl_mp.rollout.types import RolloutOutput

logger = logging.getLogger(__name__)


def build_batch(prompts: PromptBatch, out: RolloutOutput, pad_token_id: int) -> RLBatch:
    batch = RLBatch.from_samples(prompts.input_ids, out.response_ids, out.n, pad_token_id,
                                 prompts.ground_truths, prompts.data_sources)
    masks = out.padded_masks(batch.responses.shape[1])
    if masks is not None:  # multi-turn: tool responses' tokens are context, not the policy's actions
        batch.response_mask = batch.response_mask * masks
    lps = out.padded_logprobs(batch.responses.shape[1])
    batch.rollout_log_probs = None if lps is None else lps * batch.response_mask
    if out.routed_experts is not None:
        batch.set_routing(out.routed_experts)
    return batch


def reward_model_texts(out: RolloutOutput, texts: list[str], tokenizer) -> list[str]:
    """What a reward model reads after the prompt: the response; for a multi-turn sample the
    whole conversation as the chat template wrote it (turns and tool responses)."""
    if out.trajectories is None:
        return texts
    return tokenizer.batch_decode(out.response_ids, skip_special_tokens=False)


def validation_turn_metrics(rollout_metrics: dict[str, float]) -> dict[str, float]:
    """A multi-turn validation's tool use: ``val/multi_turn/{tool_call_success,
    tool_calls_per_conversation,turns_per_conversation,truncated}`` ({} for single-turn)."""
    keys = ("tool_call_success", "tool_calls_per_conversation", "turns_per_conversation", "truncated")
    return {f"val/multi_turn/{k}": rollout_metrics[f"rollout/multi_turn/{k}"] for k in keys
            if f"rollout/multi_turn/{k}" in rollout_metrics}


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
    """Fill ``advantages`` and ``returns`` (fp32) with the configured estimator: it gets the
    batch fields and ``algorithm`` settings its `EstimatorSpec` declares, plus
    ``algorithm.estimator_kwargs``, the same way for built-ins and plugins.

    ``baseline_rewards`` [B]: the greedy responses' rewards, for estimators that ask for them."""
    fn, spec = ADVANTAGE_ESTIMATORS[algo.adv_estimator], estimator_spec(algo.adv_estimator)
    kwargs = dict(token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask)
    for name in spec.inputs:
        value = baseline_rewards if name == "baseline_rewards" else getattr(batch, name)
        if value is None:
            raise ValueError(f"advantage estimator {algo.adv_estimator!r} needs {name}, which this step did not "
                             "compute")
        kwargs[name] = value
    kwargs.update({kw: getattr(algo, attr) for kw, attr in spec.params.items()})
    kwargs.update(algo.estimator_kwargs)
    batch.advantages, batch.returns = fn(**kwargs)
    check_finite({"advantages": batch.advantages, "returns": batch.returns}, "advantages",
                 hint=f"algorithm.adv_estimator={algo.adv_estimator!r}")


def apply_rollout_correction(batch: RLBatch, cfg: RolloutCorrectionConfig) -> dict[str, float]:
    """Fill ``batch.rollout_weights`` [B, T] from the trainer's old log-probs and the
    rollout's (over the whole batch, once, before it is split into mini-batches)."""
    if not cfg.enabled:
        return {}
    batch.require("old_log_probs")
    if batch.rollout_log_probs is None:
        raise RuntimeError("algorithm.rollout_correction needs the rollout's log-probs, but this step's rollout "
                           "returned none (the trainer asks for them on every step when a correction is on)")
    batch.rollout_weights, metrics = rollout_correction(
        batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, is_level=cfg.is_level,
        is_threshold=cfg.is_threshold, mask_level=cfg.mask_level, mask_low=cfg.mask_low, mask_high=cfg.mask_high)
    return metrics


def check_finite(values: dict, phase: str, hint: str = "") -> None:
    """Stop on NaN/inf (tensors or floats) with the phase and the likely causes named."""
    bad = [k for k, v in values.items()
           if (isinstance(v, torch.Tensor) and not bool(torch.isfinite(v).all()))
           or (isinstance(v, float) and not math.isfinite(v))]
    if bad:
        raise FloatingPointError(
            f"non-finite {bad} in the {phase} phase{' (' + hint + ')' if hint else ''}: typical causes are a "
            "reward function or reward model returning NaN/inf, a learning rate too high for the model, or "
            "low-precision overflow (train in bf16 or fp32, not fp16). The run stops so that nothing non-finite "
            "reaches the weights; the last checkpoint is intact")


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


def logprob_gap_metrics(batch: RLBatch, rows: torch.Tensor | None = None) -> dict[str, float]:
    """|rollout log-prob - trainer old log-prob| over real response tokens of ``rows`` ([B]
    bool, default all: the on-policy samples, whose gap measures the weight sync and the
    numerics, not staleness), and the same gap between probabilities, |exp(a) - exp(b)|
    (``rollout/prob_diff_*``: what verl logs as ``training/rollout_probs_diff_*``, so the two
    compare directly). {} on steps whose rollout returned no log-probs, or without such
    samples (off-policy steady state)."""
    if batch.rollout_log_probs is None:
        return {}
    batch.require("old_log_probs")
    mask = batch.response_mask > 0
    if rows is not None:
        if not rows.any():
            return {}
        mask = mask & rows[:, None]
    return {f"rollout/{name}": value.item()
            for name, value in logprob_gap(batch.old_log_probs, batch.rollout_log_probs, mask).items()}


def gap_from_update(metrics: dict[str, float]) -> dict[str, float]:
    """`logprob_gap_metrics`' keys, taken out of the update's metrics (``actor/rollout_<name>``)
    where the update's forward pass measured the gap (`verl_mp.plan.old_log_probs_in_update`:
    every sample is on-policy then); {} on steps whose rollout returned no log-probs."""
    return {f"rollout/{name}": metrics.pop(f"actor/rollout_{name}") for name in LOGPROB_GAP_METRICS
            if f"actor/rollout_{name}" in metrics}


def staleness_metrics(batch: RLBatch, step: int) -> dict[str, float]:
    """How many updates separate the weights that generated each sample from the actor that
    trains on it at ``step`` (version step-1): mean and max over samples."""
    if batch.weight_versions is None:
        return {}
    stale = (step - 1 - batch.weight_versions).float()
    return {"rollout/staleness_mean": stale.mean().item(), "rollout/staleness_max": stale.max().item()}


def check_logprob_gap(metrics: dict[str, float], threshold: float | None, step: int) -> None:
    if threshold is not None and metrics and metrics["rollout/logprob_diff_max"] > threshold:
        raise RuntimeError(
            f"step {step}: rollout/trainer log-prob gap {metrics['rollout/logprob_diff_max']:.3g} exceeds "
            f"rollout.logprob_diff_threshold={threshold}: the weight sync or the rollout numerics "
            "disagree with the trainer (raise the threshold only if this gap is expected, e.g. bf16)"
        )


def signal_metrics(batch: RLBatch, step: int) -> dict[str, float]:
    """``training/groups_without_signal``: the share of prompt groups whose samples all got
    the same score (their group-relative advantages are 0). A warning when no group has
    signal: the step cannot learn (rewards too sparse, or every prompt already solved)."""
    scores = (batch.token_level_scores * batch.response_mask).sum(-1)
    groups = {}
    for gid, score in zip(batch.group_ids.tolist(), scores.tolist(), strict=True):
        groups.setdefault(gid, set()).add(round(score, 6))
    flat = sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)
    if flat == 1.0 and len(next(iter(groups.values()), ())) and batch.group_ids.numel() > len(groups):
        logger.warning("step %d: every prompt's samples got the same reward, so every group-relative advantage "
                       "is 0 and this step learns nothing (rewards too sparse, or the prompts already solved; "
                       "docs/troubleshooting.md)", step)
    return {"training/groups_without_signal": flat}


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
