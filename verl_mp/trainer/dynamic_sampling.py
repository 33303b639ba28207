"""Dynamic sampling (``data.filter_groups``): drop groups whose rewards are all equal and
refill the step with groups of new prompts, within a bound on extra generation.

Under group-relative advantages (GRPO, RLOO, ...) a group whose ``n`` samples got the same
reward has advantage 0 everywhere: it costs a training pass and teaches nothing. A step
keeps the groups with differing rewards; while it has fewer than ``data.train_batch_size``
it generates another round of that many new prompts (at most
``data.filter_groups.max_extra_rounds``), and when the rounds are used up it tops the batch
up with dropped groups, so every step trains on the configured batch size.

`ScoredSamples` is a step's samples with their sequence rewards and the weight version
that generated each; `fill_groups` is the pure selection logic (rounds come from a
callable), so it is tested without workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verl_mp.data.batch import PromptBatch
from verl_mp.rollout.types import RolloutOutput


@dataclass
class ScoredSamples:
    """``G`` prompts and their ``G x n`` samples (prompt-major)."""

    prompts: PromptBatch
    out: RolloutOutput
    scores: torch.Tensor
    """[G*n] float32 sequence rewards."""
    versions: torch.Tensor
    """[G*n] int64: the actor version (updates applied) of the weights that generated each sample."""
    reward_metrics: dict[str, float]
    """The reward manager's metrics of these samples (of the first round, after `fill_groups`)."""

    @property
    def num_groups(self) -> int:
        return len(self.prompts)

    def groups(self, index: list[int]) -> ScoredSamples:
        """The samples of groups ``index``, in that order."""
        n = self.out.n
        rows = [g * n + j for g in index for j in range(n)]
        p = self.prompts
        prompts = PromptBatch(**{f: [getattr(p, f)[g] for g in index] for f in PromptBatch._list_fields()})
        out = self.out.select(index)  # every per-sample field (multi-turn masks and trajectories too)
        rows_t = torch.tensor(rows, dtype=torch.int64)
        return ScoredSamples(prompts, out, self.scores[rows_t], self.versions[rows_t], dict(self.reward_metrics))

    @staticmethod
    def concat(parts: list[ScoredSamples]) -> ScoredSamples:
        """The groups of ``parts`` one after the other (metrics and wall times of the first)."""
        first = parts[0]
        if len(parts) == 1:
            return first
        prompts = PromptBatch(**{f: [x for s in parts for x in getattr(s.prompts, f)]
                                 for f in PromptBatch._list_fields()})
        out = RolloutOutput.concat([s.out for s in parts])
        return ScoredSamples(prompts, out, torch.cat([s.scores for s in parts]),
                             torch.cat([s.versions for s in parts]), dict(first.reward_metrics))


def informative_groups(scores: torch.Tensor, n: int) -> torch.Tensor:
    """``[G]`` bool: True for groups whose ``n`` rewards are not all equal (``scores`` [G*n])."""
    grouped = scores.view(-1, n)
    return grouped.max(-1).values != grouped.min(-1).values


def fill_groups(first: ScoredSamples, next_round: Callable[[int], ScoredSamples], target_groups: int,
                max_extra_rounds: int) -> tuple[ScoredSamples, dict[str, float]]:
    """Keep the informative groups of ``first`` and of up to ``max_extra_rounds`` more
    rounds (``next_round(r)``, r = 1, 2, ...; called only while fewer than
    ``target_groups`` are kept), take the first ``target_groups`` of them, and top up with
    dropped groups (in generation order) when the rounds run out. Returns the batch and the
    ``filter/*`` metrics."""
    kept: list[ScoredSamples] = []
    dropped: list[ScoredSamples] = []
    rounds, current, num_kept, generated = 0, first, 0, 0
    while True:
        keep = informative_groups(current.scores, current.out.n)
        generated += current.num_groups
        kept.append(current.groups([g for g in range(current.num_groups) if keep[g]]))
        dropped.append(current.groups([g for g in range(current.num_groups) if not keep[g]]))
        num_kept += int(keep.sum())
        if num_kept >= target_groups or rounds >= max_extra_rounds:
            break
        rounds += 1
        current = next_round(rounds)
    chosen = ScoredSamples.concat([s for s in kept + dropped if s.num_groups])
    chosen = chosen.groups(list(range(target_groups)))
    chosen.reward_metrics = dict(first.reward_metrics)
    num_dropped = generated - num_kept
    metrics = {"filter/kept_groups": float(min(num_kept, target_groups)),
               "filter/dropped_groups": float(num_dropped),
               "filter/dropped_frac": num_dropped / max(generated, 1),
               "filter/extra_rounds": float(rounds),
               "filter/generated_samples": float(generated * first.out.n),
               "filter/topped_up_groups": float(max(target_groups - num_kept, 0))}
    return chosen, metrics
