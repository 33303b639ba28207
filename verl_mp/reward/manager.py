"""RewardManager: per-sample rule rewards (and optionally a reward model) -> scores + metrics."""

from __future__ import annotations

import functools
import inspect
import logging
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verl_mp.reward.executor import Outcome, RewardExecutor
from verl_mp.reward.registry import (
    DEFAULT_FN_BY_SOURCE,
    FileFunction,
    RewardFn,
    get_reward_fn,
    no_reward_fn_message,
)
from verl_mp.reward.worker_proc import WorkerLimits
from verl_mp.utils.failure_budget import FailureBudget

logger = logging.getLogger(__name__)


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence score on its last valid response token.

    scores: [B]; response_mask: [B, T] (1 for response tokens, any padding layout).
    Returns float32 [B, T], zero elsewhere. A row with no valid token gets no reward.
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores {tuple(scores.shape)} must be [B] and response_mask "
                         f"{tuple(response_mask.shape)} [B, T]")
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values  # [B], -1 if empty
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] = scores.to(torch.float32, copy=False).to(mask.device)[rows]
    return rewards


@dataclass(slots=True)
class RewardResult:
    """Per-sample scores [B] (float32; failed samples 0), statuses and reduced metrics."""

    scores: torch.Tensor
    statuses: list[str]
    metrics: dict[str, float]

    def token_level(self, response_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] float32 rewards: the score on the last valid response token."""
        return token_level_rewards(self.scores, response_mask)


class RewardManager:
    """Chooses a reward function per sample by data source and runs them safely.

    ``fn_by_source`` maps data_source -> reward name or ``module:function`` plugin, on
    top of the built-in ``DEFAULT_FN_BY_SOURCE``; ``default_fn`` serves any other source.
    A function that raises, returns garbage or runs past ``timeout_s`` gives 0 for that
    sample and is counted in ``reward/num_failed`` / ``reward/num_timeout``; when more than
    ``max_failure_fraction`` of one function's calls fail, `score` raises instead (at once:
    the calls still waiting are cancelled). Responses must be decoded text without special
    tokens.

    Reward-model scores (``score(model_scores=...)``, or computed here from ``prompt +
    response`` when a ``reward_model`` with ``.score(texts)`` is given) are combined as
    ``model_combine`` says: ``add`` gives rule score + ``model_coef`` x model score;
    ``replace`` gives ``model_coef`` x model score and runs no rule function.
    """

    def __init__(
        self, fn_by_source: Mapping[str, str] | None = None, default_fn: str | None = None,
        timeout_s: float = 10.0, num_workers: int = 4, reward_model: Any = None,
        model_combine: str = "add", model_coef: float = 1.0, limits: WorkerLimits | None = None,
        max_calls_per_worker: int = 1000, pass_env: Sequence[str] = (),
        max_failure_fraction: float | None = None,
    ):
        """``limits``, ``max_calls_per_worker``, ``pass_env``: how reward workers are contained
        (`verl_mp.reward.executor`). ``max_failure_fraction``: `score` raises
        `CallsFailedError` when more than this fraction of one function's calls in a batch
        fail or time out (``reward.max_failure_fraction``; None: never)."""
        if model_combine not in ("add", "replace"):
            raise ValueError(f"model_combine={model_combine!r} must be 'add' or 'replace'")
        self.fn_names = {**DEFAULT_FN_BY_SOURCE, **(fn_by_source or {})}
        self.default_fn = default_fn
        self._fns = {name: get_reward_fn(name) for name in set(self.fn_names.values())}
        if default_fn is not None:
            self._fns[default_fn] = get_reward_fn(default_fn)
        if num_workers > 0:
            for name, fn in self._fns.items():
                _check_picklable(name, fn)
        self.executor = RewardExecutor(num_workers=num_workers, timeout_s=timeout_s, limits=limits,
                                       max_calls_per_worker=max_calls_per_worker, pass_env=tuple(pass_env))
        self.reward_model = reward_model
        self.model_combine, self.model_coef = model_combine, model_coef
        self.budget = None if max_failure_fraction is None else \
            FailureBudget("reward function", "reward.max_failure_fraction", max_failure_fraction)

    def resolve(self, data_source: str) -> RewardFn:
        """The reward function for a data source; ValueError with the fix if none."""
        return self._fns[self.fn_name(data_source)]

    def fn_name(self, data_source: str) -> str:
        """The name (registered name or ``module:function``) of a data source's function."""
        name = self.fn_names.get(data_source, self.default_fn)
        if name is None:
            raise ValueError(no_reward_fn_message(data_source, self.fn_names))
        return name

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """Fail at start-up, not mid-run, if some data source has no reward function."""
        for source in sorted(set(data_sources)):
            self.resolve(source)

    def score(
        self, responses: Sequence[str], ground_truths: Sequence[str], data_sources: Sequence[str],
        extra_infos: Sequence[dict[str, Any] | None] | None = None,
        prompts: Sequence[str] | None = None, model_scores: torch.Tensor | None = None,
        trajectories: Sequence[dict] | None = None,
    ) -> RewardResult:
        """Score B decoded responses; never raises for a failing reward function.

        ``model_scores`` [B]: reward-model scores computed elsewhere (e.g. by a reward
        model worker group); otherwise the ``reward_model`` given at construction scores
        ``prompts[i] + responses[i]``. ``trajectories`` [B] (multi-turn rollouts): each
        sample's conversation, passed as ``trajectory=`` to reward functions that take it."""
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * len(responses)
        if not len(responses) == len(ground_truths) == len(data_sources) == len(extra_infos):
            raise ValueError("responses, ground_truths, data_sources and extra_infos differ "
                             "in length")
        if self.model_combine == "add":
            calls = [(self.resolve(src), (src, resp, gt, extra))
                     for resp, gt, src, extra in zip(responses, ground_truths, data_sources,
                                                     extra_infos, strict=True)]
            if trajectories is not None:
                calls = with_trajectories(calls, trajectories)
            names = [self.fn_name(src) for src in data_sources]
            outcomes = self.executor.run(calls, stop_when=self._over_budget(names))
            _log_failures(outcomes)
            if self.budget is not None:
                self.budget.check(names, _statuses(outcomes), [o.message for o in outcomes])
        else:  # replace: no rule function runs
            outcomes = [Outcome(status="ok", score=0.0) for _ in responses]
        scores = torch.tensor([o.score if o.status == "ok" else 0.0 for o in outcomes],
                              dtype=torch.float32)
        metrics = reduce_metrics(scores, outcomes)
        if model_scores is None and self.reward_model is not None:
            model_scores = self._model_scores(responses, prompts)
        if model_scores is not None:
            scores = self._combine(scores, model_scores, metrics)
        elif self.model_combine == "replace":
            raise ValueError("model_combine='replace' needs reward-model scores")
        return RewardResult(scores=scores, statuses=[o.status for o in outcomes], metrics=metrics)

    def _over_budget(self, names: list[str]):
        """For `RewardExecutor.run`: stop the batch once a function's failures exceed the budget."""
        if self.budget is None:
            return None
        return lambda outcomes: self.budget.exceeded(names, _statuses(outcomes)) is not None

    def _model_scores(self, responses: Sequence[str], prompts: Sequence[str] | None) -> torch.Tensor:
        if prompts is None or len(prompts) != len(responses):
            raise ValueError("a reward model needs the prompt text of every response")
        return self.reward_model.score([p + r for p, r in zip(prompts, responses, strict=True)])

    def _combine(self, scores: torch.Tensor, model_scores: torch.Tensor,
                 metrics: dict[str, float]) -> torch.Tensor:
        model_scores = model_scores.float().cpu()
        if model_scores.shape != scores.shape:
            raise ValueError(f"{model_scores.numel()} reward-model scores for {scores.numel()} responses")
        metrics.update(_stats("reward/model_score", model_scores))
        if self.model_combine == "add":
            metrics["reward/rule_score/mean"] = scores.mean().item()
            total = scores + self.model_coef * model_scores
        else:
            total = self.model_coef * model_scores
        metrics.update(_stats("reward/score", total))
        return total

    def close(self) -> None:
        """Stop the reward worker processes."""
        self.executor.close()


def with_trajectories(calls: list[tuple], trajectories: Sequence[dict]) -> list[tuple]:
    """Bind each sample's trajectory (``trajectory=``) to the reward functions that take one."""
    if len(trajectories) != len(calls):
        raise ValueError(f"{len(trajectories)} trajectories for {len(calls)} responses")
    return [(functools.partial(fn, trajectory=t), args) if accepts_trajectory(fn) else (fn, args)
            for (fn, args), t in zip(calls, trajectories, strict=True)]


def accepts_trajectory(fn: RewardFn) -> bool:
    """The function has a ``trajectory`` parameter (or ``**kwargs``)."""
    target = fn.resolve() if isinstance(fn, FileFunction) else fn
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return "trajectory" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def reduce_metrics(scores: torch.Tensor, outcomes: list[Outcome]) -> dict[str, float]:
    """reward/score/{mean,std,max,min}, failure counts, reward/accuracy and extra means."""
    metrics = _stats("reward/score", scores)
    metrics["reward/num_failed"] = float(sum(o.status == "error" for o in outcomes))
    metrics["reward/num_timeout"] = float(sum(o.status == "timeout" for o in outcomes))
    extras: dict[str, list[float]] = {}
    for outcome in outcomes:
        for key, value in (outcome.extras or {}).items():
            extras.setdefault(key, []).append(value)
    for key, values in extras.items():
        name = "reward/accuracy" if key == "acc" else f"reward/{key}/mean"
        metrics[name] = sum(values) / len(values)
    return metrics


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/std": values.std(unbiased=False).item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _statuses(outcomes: Sequence[Outcome | None]) -> list[str | None]:
    """Each call's status for `FailureBudget`; None while it runs (or was cancelled)."""
    return [None if o is None or o.status == "cancelled" else o.status for o in outcomes]


def _log_failures(outcomes: list[Outcome]) -> None:
    """One warning per batch with the first failure's message (not one per sample)."""
    failed = [o for o in outcomes if o.status not in ("ok", "cancelled")]
    if failed:
        logger.warning("reward: %d of %d samples failed or timed out (scored 0); first: %s: %s",
                       len(failed), len(outcomes), failed[0].status, failed[0].message)


def _check_picklable(name: str, fn: RewardFn) -> None:
    """Functions travel to worker processes by pickle: fail early with the fix."""
    try:
        pickle.dumps(fn)
    except Exception as err:
        raise ValueError(
            f"reward function '{name}' cannot be sent to reward worker processes ({err}). "
            "Fix: define it at module level in an importable module or a .py file, or set "
            "reward.num_workers=0 (no timeouts)."
        ) from err
