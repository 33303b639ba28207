"""Engine loss functions built from the algorithm layer (per micro-batch, [b, s] aligned).

Every loss is normalised by *global* counts of the whole mini-batch (all micro-batches,
all data-parallel ranks), so the engine can sum contributions. Mean-type metrics are
scaled by (local tokens / global tokens) for the same reason; ``*_max``/``*_min`` are
reduced by max/min.
"""

from __future__ import annotations

import torch

from verl_mp.algo import POLICY_LOSSES, agg_loss, kl_loss, value_loss
from verl_mp.algo.rollout_correction import logprob_gap
from verl_mp.config.schema import PolicyUpdateConfig, ValueUpdateConfig


def _scale_means(metrics: dict, local_tokens: torch.Tensor, global_tokens: float) -> dict:
    out = {}
    for k, v in metrics.items():
        v = v.detach().float()
        out[k] = v if k.endswith(("_max", "_min")) else v * (local_tokens / global_tokens)
    return out


def actor_loss(cfg: PolicyUpdateConfig, global_tokens: float, global_seqs: float, max_len: int):
    policy_loss = POLICY_LOSSES[cfg.policy_loss]
    counts = dict(global_num_tokens=global_tokens, global_num_seqs=global_seqs, max_response_len=max_len)

    def loss_fn(outputs: dict, mb: dict):
        log_probs, mask = outputs["log_probs"], mb["response_mask"]
        # The rollout correction's weights (present only when one is on) multiply the
        # per-token policy-gradient term; they are fixed per token, so the sum over
        # micro-batches and DP ranks is unchanged by the split.
        weights = {"token_weights": mb["rollout_weights"]} if "rollout_weights" in mb else {}
        # Without old log-probs in the batch the plan takes them from this forward pass (one
        # optimizer step on fresh samples: `verl_mp.plan.old_log_probs_in_update`): the ratio is 1.
        old = mb["old_log_probs"] if "old_log_probs" in mb else log_probs.detach()
        loss, metrics = policy_loss(log_probs, old, mb["advantages"], mask,
                                    clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high,
                                    clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode,
                                    **counts, **weights)
        out = {"pg_loss": loss.detach()}
        if "entropy" in outputs:
            entropy = agg_loss(outputs["entropy"], mask, cfg.loss_agg_mode, **counts)
            loss = loss - cfg.entropy_coeff * entropy
            out["entropy"] = entropy.detach()
        if cfg.use_kl_loss:
            kl, _ = kl_loss(log_probs, mb["ref_log_probs"], mask, estimator=cfg.kl_loss_type,
                            loss_agg_mode=cfg.loss_agg_mode, **counts)
            loss = loss + cfg.kl_loss_coef * kl
            out["kl_loss"] = kl.detach()
            # Reduced by max and min over every rank: equal values prove that each rank's
            # loss used the same configured coefficient.
            coef = torch.tensor(float(cfg.kl_loss_coef))
            out["kl_loss_coef_max"], out["kl_loss_coef_min"] = coef, coef
        if "rollout_log_probs" in mb:  # the rollout-vs-trainer gap, measured here instead of by a forward pass
            gap = logprob_gap(log_probs.detach(), mb["rollout_log_probs"], mask)
            metrics.update({f"rollout_{name}": value for name, value in gap.items()})
        local = mask.sum()
        return loss, {**out, **_scale_means(metrics, local, global_tokens)}

    return loss_fn


def critic_loss(cfg: ValueUpdateConfig, global_tokens: float, global_seqs: float, max_len: int):
    counts = dict(global_num_tokens=global_tokens, global_num_seqs=global_seqs, max_response_len=max_len)

    def loss_fn(outputs: dict, mb: dict):
        mask = mb["response_mask"]
        loss, metrics = value_loss(outputs["values"], mb["values"], mb["returns"], mask,
                                   clip_range_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode, **counts)
        return loss, {"vf_loss": loss.detach(), **_scale_means(metrics, mask.sum(), global_tokens)}

    return loss_fn
