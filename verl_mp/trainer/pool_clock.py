"""Busy and idle time of the training pool and the rollout pool, and how much generation
overlapped training, per step (wall clock, ``time.time()``).

Intervals come from two clocks: the driver times its own phases (forward, update, weight
sync: the training pool works during them, and the rollout pool during the sync), and the
rollout workers stamp each generation's start and end (`RolloutOutput.wall_start/end`).
On one machine both are the same clock; across nodes they differ by the clock skew.
A step's window is from its start to its end on the driver. With the rollout colocated,
both pools are the same ranks and every interval counts for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Interval = tuple[float, float]
TRAIN, ROLLOUT = "train", "rollout"


def clipped_union(intervals: list[Interval], window: Interval) -> float:
    """Length of the union of ``intervals`` inside ``window`` (seconds)."""
    lo, hi = window
    parts = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, end = 0.0, lo
    for a, b in parts:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def overlap(first: list[Interval], second: list[Interval], window: Interval) -> float:
    """Seconds inside ``window`` where some interval of ``first`` and one of ``second`` both run."""
    a, b = clipped_union(first, window), clipped_union(second, window)
    return max(a + b - clipped_union(first + second, window), 0.0)


@dataclass
class PoolClock:
    colocated: bool
    """The rollout runs in the training pool's processes."""
    busy: dict[str, list[Interval]] = field(default_factory=lambda: {TRAIN: [], ROLLOUT: []})
    generations: list[Interval] = field(default_factory=list)
    training: list[Interval] = field(default_factory=list)
    """Forward and update phases (what generation can overlap with)."""

    def phase(self, name: str, start: float, end: float) -> None:
        """A driver phase: forward/update keep the training pool busy, the sync both pools."""
        if name in ("forward", "update"):
            self.training.append((start, end))
            self.busy[TRAIN].append((start, end))
        elif name == "weight_sync":
            self.busy[TRAIN].append((start, end))
            self.busy[ROLLOUT].append((start, end))

    def generation(self, start: float, end: float) -> None:
        """A generation the rollout workers stamped (recorded once, however often seen)."""
        if end > start and (start, end) not in self.generations:
            self.generations.append((start, end))
            self.busy[ROLLOUT].append((start, end))

    def step_metrics(self, window: Interval) -> dict[str, float]:
        """Idle seconds (and fractions) of each pool in ``window`` and the overlap of
        generation with training; intervals that ended before the window are dropped."""
        length = max(window[1] - window[0], 1e-9)
        rollout = self.busy[ROLLOUT] + (self.busy[TRAIN] if self.colocated else [])
        train = self.busy[TRAIN] + (self.busy[ROLLOUT] if self.colocated else [])
        idle_rollout = length - clipped_union(rollout, window)
        idle_train = length - clipped_union(train, window)
        metrics = {"timing/gen_train_overlap_s": overlap(self.generations, self.training, window),
                   "timing/idle_rollout_s": idle_rollout, "timing/idle_train_s": idle_train,
                   "perf/idle_frac_rollout": idle_rollout / length, "perf/idle_frac_train": idle_train / length}
        self._prune(window[1])
        return metrics

    def _prune(self, before: float) -> None:
        # An interval ending before this step's end cannot reach into the next window.
        keep = lambda xs: [x for x in xs if x[1] > before]  # noqa: E731
        self.generations, self.training = keep(self.generations), keep(self.training)
        self.busy = {k: keep(v) for k, v in self.busy.items()}
