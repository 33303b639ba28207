"""``trainer.profile``: torch.profiler over chosen steps, on chosen ranks of every worker group."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class ProfileConfig:
    steps: list[int] = field(default_factory=list)
    """Steps to profile (e.g. [2]: after step 1's warm-up); empty: none. Each profiled step
    writes, per profiled rank, under ``<default_local_dir>/profile/step_<N>/``: the kernels
    and ops ranked by their own device time (CPU time on a CPU run), ``<group>_rank<R>.txt``;
    the time inside each phase of the step, ``<group>_rank<R>_phases.json``; and the
    timeline, ``<group>_rank<R>.trace.json.gz`` (chrome://tracing or Perfetto). Profiling
    slows the step it covers: its timing metrics are not comparable to the others'. With the
    rollout on a pool of its own and ``trainer.off_policy_steps > 0`` the rollout group's
    session covers the generation running during the step (the next step's), and opening and
    closing it waits for that group's calls in flight, so the step loses its overlap."""
    ranks: list[int] = field(default_factory=lambda: [0])
    """Ranks (within each worker group) that profile."""
    top: int = 40
    """Rows of the ranked table."""
    record_shapes: bool = False
    """Also record input shapes (the table then splits ops by shape)."""
    with_stack: bool = False
    """Also record Python stacks (large traces; for finding who launches a kernel)."""
    trace: bool = True
    """Write the timeline (it can be tens of MB for a GPU step)."""
    ops: bool = True
    """Record torch ops and GPU kernels with torch.profiler (the ranked table, the phases and
    the timeline). false: only ``host``'s table: torch.profiler's CPU-op recording slows a
    host-bound phase (a small model's generation) ~2.5x, and cProfile alone distorts it less."""
    host: bool = False
    """Also run Python's cProfile over the step on each profiled rank (an in-process vLLM
    engine included; on Python 3.12+ every thread of the process, e.g. the tool pool's, on
    older ones the rank's main thread): ``<group>_rank<R>_host.txt`` ranks the Python
    functions by their own and by cumulative time. For host-bound phases, where the table of
    ops says little; it slows Python-heavy code more than the GPU's work."""

    def __post_init__(self) -> None:
        bad = [s for s in self.steps if s < 1]
        if bad:
            raise ValueError(f"trainer.profile.steps={self.steps}: steps start at 1 (got {bad})")
        if any(r < 0 for r in self.ranks):
            raise ValueError(f"trainer.profile.ranks={self.ranks}: ranks must be >= 0")
        if self.top < 1:
            raise ValueError(f"trainer.profile.top={self.top} must be >= 1")
        if self.host and self.with_stack:
            raise ValueError("trainer.profile.host=true and trainer.profile.with_stack=true both hook Python's "
                             "profiler (cProfile, torch.profiler's Python tracer): turn one off")
        if not self.ops and not self.host:
            raise ValueError("trainer.profile.ops=false with trainer.profile.host=false records nothing: "
                             "set trainer.profile.host=true (the Python table alone) or ops=true")
