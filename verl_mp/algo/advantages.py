"""Advantage estimators: `ADVANTAGE_ESTIMATORS[name](**kwargs) -> (advantages, returns)`.

All tensors are `[B, T]` over response tokens, right-padded, with `response_mask` 1 on
real tokens; `group_ids` is int64 `[B]` (samples of one prompt share an id). Outputs are
fp32 and zero wherever the mask is zero. Each estimator accepts ``impl=`` ("torch",
"triton", "auto"/None) to choose the fused kernel or its torch reference
(`verl_mp.kernels.dispatch`).

Padding inside a response (e.g. masked tool-output tokens) is transparent to the
recursive estimators: a masked step carries the next real token's value and advantage.
A group of one sample gets advantage 0 (there is no baseline) and a one-time warning.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from verl_mp.algo.registry import Registry
from verl_mp.algo.utils import as_float_mask, has_warned, masked_whiten, warn_once
from verl_mp.kernels.dispatch import select_impl
from verl_mp.kernels.gae import gae_triton
from verl_mp.kernels.group_adv import group_advantages_triton

ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
_SINGLETON_KEY = "advantages/singleton-group"

BATCH_INPUTS = ("values", "group_ids", "baseline_rewards", "old_log_probs", "ref_log_probs",
                "rollout_log_probs")
"""What an estimator may ask for besides ``token_level_rewards`` and ``response_mask``
(always given): ``values`` [B, T] (a critic runs), ``group_ids`` [B],
``baseline_rewards`` [B] (the rewards of a greedy response per prompt: the trainer
generates it), and the per-token log-probs [B, T] of the actor before the update, the
reference policy (a reference runs) and the rollout engine."""


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator needs; the trainer reads it to decide which phases run.

    ``inputs``: names from `BATCH_INPUTS`, passed by keyword. ``params``: keyword ->
    field of ``algorithm`` in the run config (e.g. ``{"gamma": "gamma"}``); a plugin's
    own settings come from ``algorithm.estimator_kwargs``.
    """

    inputs: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs) - set(BATCH_INPUTS))
        if unknown:
            raise ValueError(f"advantage estimator inputs {unknown} are not batch fields; valid: {list(BATCH_INPUTS)}")

    @property
    def needs_critic(self) -> bool:
        return "values" in self.inputs

    @property
    def needs_reference(self) -> bool:
        return "ref_log_probs" in self.inputs

    @property
    def needs_greedy_baseline(self) -> bool:
        return "baseline_rewards" in self.inputs


def advantage_estimator(name: str | None = None, *, inputs: tuple[str, ...] = (),
                        params: dict[str, str] | None = None):
    """Decorator declaring an estimator's `EstimatorSpec`; with ``name`` it also registers it.

    Plugins (``algorithm.adv_estimator=my_pkg.mod:fn``) use it without a name::

        @advantage_estimator(inputs=("values",), params={"gamma": "gamma"})
        def my_estimator(token_level_rewards, response_mask, values, gamma): ...
    """
    spec = EstimatorSpec(inputs=tuple(inputs), params=dict(params or {}))

    def decorate(fn):
        fn.estimator_spec = spec
        if name is not None:
            ADVANTAGE_ESTIMATORS.add(name, fn)
        return fn

    return decorate


def estimator_spec(name: str) -> EstimatorSpec:
    """The spec of a registered estimator or plugin; a function without a declared spec
    gets one inferred from its signature (parameters named like `BATCH_INPUTS`)."""
    fn = ADVANTAGE_ESTIMATORS[name]
    spec = getattr(fn, "estimator_spec", None)
    if spec is not None:
        return spec
    names = inspect.signature(fn).parameters
    return EstimatorSpec(inputs=tuple(n for n in BATCH_INPUTS if n in names))


def gae_scan_torch(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference GAE, one step at a time from the end. Returns un-whitened fp32
    (advantages, returns), `[B, T]`, zero on padding."""
    rewards, vals, mask = token_level_rewards.float(), values.float(), as_float_mask(response_mask)
    num_steps = rewards.shape[-1]
    adv = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[..., 0])
    next_value = torch.zeros_like(last_gae)
    for t in reversed(range(num_steps)):
        m = mask[..., t]
        delta = rewards[..., t] + gamma * next_value - vals[..., t]
        gae_t = delta + gamma * lam * last_gae
        adv[..., t] = m * gae_t
        last_gae = m * gae_t + (1.0 - m) * last_gae
        next_value = m * vals[..., t] + (1.0 - m) * next_value
    return adv, (adv + vals) * mask


def group_outcome_torch(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    mode: str,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference for the group kernel. mode: "std" | "mean" | "rloo".

    Returns advantages `[B, T]` fp32, scores `[B]` fp32, group sizes `[B]` int32.
    """
    mask = as_float_mask(response_mask)
    scores = (token_level_rewards.float() * mask).sum(-1)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    counts = torch.bincount(inverse, minlength=num_groups).float()
    positions = torch.arange(scores.numel(), device=scores.device)
    first = torch.full((num_groups,), scores.numel(), device=scores.device, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    shift = scores[first]  # a member's own score: equal scores give exactly zero deviation
    sum_dev = torch.zeros_like(counts).index_add_(0, inverse, scores - shift[inverse])
    mean = shift + sum_dev / counts
    dev = scores - mean[inverse]
    n = counts[inverse]
    scale = (n > 1).float()
    if mode == "std":
        sum_sq = torch.zeros_like(counts).index_add_(0, inverse, dev * dev)
        std = torch.sqrt(sum_sq / (counts - 1.0).clamp(min=1.0))
        scale = scale / (std[inverse] + eps)
    elif mode == "rloo":
        scale = scale * n / (n - 1.0).clamp(min=1.0)
    elif mode != "mean":
        raise ValueError(f"group mode {mode!r} must be 'std', 'mean' or 'rloo'")
    return (dev * scale)[:, None] * mask, scores, n.to(torch.int32)


def _group_outcome(rewards, response_mask, group_ids, mode, eps, impl) -> torch.Tensor:
    """Dispatch to the kernel or the reference and warn once about singleton groups."""
    if select_impl(impl, rewards.device) == "triton":
        adv, _, sizes = group_advantages_triton(rewards, response_mask, group_ids, mode, eps)
    else:
        adv, _, sizes = group_outcome_torch(rewards, response_mask, group_ids, mode, eps)
    if not has_warned(_SINGLETON_KEY) and bool((sizes == 1).any()):
        warn_once(
            _SINGLETON_KEY,
            "a group has a single sample, so its advantage is 0 (no baseline); "
            "use rollout n > 1 for group-based estimators",
        )
    return adv


def _discounted_returns(rewards, response_mask, gamma, impl) -> torch.Tensor:
    """Return-to-go over real tokens, `[B, T]` fp32 (GAE with values 0 and lambda 1)."""
    zeros = torch.zeros_like(rewards, dtype=torch.float32)
    if select_impl(impl, rewards.device) == "triton":
        return gae_triton(rewards.contiguous(), zeros, response_mask.contiguous(), gamma, 1.0)[0]
    return gae_scan_torch(rewards, zeros, response_mask, gamma, 1.0)[0]


@advantage_estimator("gae", inputs=("values",), params={"gamma": "gamma", "lam": "lam"})
def gae(token_level_rewards, values, response_mask, gamma, lam, *, whiten=True, impl=None):
    """Generalised advantage estimation (PPO with a critic).

    Returns (advantages, returns) `[B, T]` fp32; returns = raw advantages + values;
    advantages are whitened over the batch's real tokens when `whiten`.
    """
    if select_impl(impl, token_level_rewards.device) == "triton":
        adv, ret = gae_triton(
            token_level_rewards.contiguous(),
            values.contiguous(),
            response_mask.contiguous(),
            gamma,
            lam,
        )
    else:
        adv, ret = gae_scan_torch(token_level_rewards, values, response_mask, gamma, lam)
    return (masked_whiten(adv, response_mask) if whiten else adv), ret


@advantage_estimator("grpo", inputs=("group_ids",), params={"norm_by_std": "norm_adv_by_std_in_grpo"})
def grpo(token_level_rewards, response_mask, group_ids, norm_by_std=True, eps=1e-6, *, impl=None):
    """GRPO: (score - group mean) / (group std + eps), broadcast over the response.

    score = sum of rewards over real tokens; std is unbiased. `norm_by_std=False` gives
    Dr.GRPO (mean only). Returns (advantages, returns) with returns = advantages.
    """
    mode = "std" if norm_by_std else "mean"
    adv = _group_outcome(
        token_level_rewards.contiguous(), response_mask.contiguous(), group_ids, mode, eps, impl
    )
    return adv, adv


@advantage_estimator("rloo", inputs=("group_ids",))
def rloo(token_level_rewards, response_mask, group_ids, *, impl=None):
    """RLOO: score minus the mean score of the other samples of the group."""
    adv = _group_outcome(
        token_level_rewards.contiguous(), response_mask.contiguous(), group_ids, "rloo", 0.0, impl
    )
    return adv, adv


@advantage_estimator("reinforce_plus_plus", params={"gamma": "gamma"})
def reinforce_plus_plus(token_level_rewards, response_mask, gamma, *, impl=None):
    """REINFORCE++: discounted return-to-go, whitened over the batch's real tokens.

    Returns (advantages, returns) with returns the un-whitened return-to-go.
    """
    returns = _discounted_returns(token_level_rewards, response_mask, gamma, impl)
    return masked_whiten(returns, response_mask), returns


@advantage_estimator("reinforce_plus_plus_baseline", inputs=("group_ids",))
def reinforce_plus_plus_baseline(token_level_rewards, response_mask, group_ids, *, impl=None):
    """REINFORCE++ with a group-mean baseline: (score - group mean), broadcast over the
    response, then whitened over the batch's real tokens. Returns (advantages, advantages)."""
    centred = _group_outcome(
        token_level_rewards.contiguous(), response_mask.contiguous(), group_ids, "mean", 0.0, impl
    )
    adv = masked_whiten(centred, response_mask)
    return adv, adv


@advantage_estimator("remax", inputs=("baseline_rewards",))
def remax(token_level_rewards, response_mask, baseline_rewards):
    """ReMax: undiscounted return-to-go minus the greedy response's reward.

    Args:
        baseline_rewards: `[B]` outcome reward of the greedy (baseline) response.
    Returns (advantages, returns) with returns the return-to-go.
    """
    mask = as_float_mask(response_mask)
    returns = (token_level_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1) * mask
    return (returns - baseline_rewards.float()[:, None]) * mask, returns
