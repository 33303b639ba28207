"""torch.profiler over one training step in a worker process (``trainer.profile``).

The driver opens a session on every worker group before a profiled step and closes it
after (`verl_mp.workers.groups.WorkerGroups.start_profile`); in between, each phase of the
worker runs under a ``verl_mp/<phase>`` label (`phase`), so the outputs split the step by
phase. On close a profiling rank writes three files (`ProfileConfig` says which):

- ``<name>.txt``: ops and kernels ranked by their own device time (CPU time on a CPU run);
- ``<name>_phases.json``: per phase, CPU and device milliseconds; and the device time of
  the step's kernels by kind (``gemm``, vLLM's fused-MoE GEMM included; ``attention``;
  ``verl_mp``: the project's Triton kernels; ``triton``: torch.compile's generated ones;
  ``nccl``, ``copy``, ``elementwise``, ``other``: by name, so a hand-written kernel of another
  library may land in ``other``: the ranked table names it), the first place to look for
  where a GPU step goes;
- ``<name>.trace.json.gz``: the timeline.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch.autograd import DeviceType

logger = logging.getLogger(__name__)

PREFIX = "verl_mp/"

KERNEL_KINDS = (  # first match wins; lower-cased kernel names
    ("nccl", ("nccl",)),
    ("verl_mp", ("logprob_fwd_kernel", "logprob_bwd_kernel", "gae_kernel", "group_adv_kernel")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "cudnn_sdpa")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "_mm_", "wgmma",
              "fused_moe_kernel", "grouped_mm")),  # vLLM's Triton MoE GEMM; torch's grouped GEMM
    ("triton", ("triton_",)),  # inductor-generated (torch.compile); other Triton kernels go by their own names
    ("copy", ("memcpy", "memset", "copy_", "catarray", "transpose")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "softmax", "norm", "unrolled")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, needles in KERNEL_KINDS:
        if any(n in low for n in needles):
            return kind
    return "other"


def phase(name: str):
    """The label a worker phase runs under (cheap when no profiler is recording)."""
    return torch.profiler.record_function(PREFIX + name)


class StepProfiler:
    """One process's profiling session (at most one open at a time)."""

    def __init__(self):
        self._prof = None
        self._host = None  # cProfile.Profile while trainer.profile.host is on
        self._target: tuple[Path, str, dict] | None = None

    @property
    def active(self) -> bool:
        return self._target is not None

    def start(self, directory: str, name: str, settings) -> None:
        """Start recording; ``settings``: a `verl_mp.config.profile.ProfileConfig`."""
        if self._target is not None:
            raise RuntimeError("a profiling session is already open in this process")
        if settings.ops:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities, record_shapes=settings.record_shapes,
                                                with_stack=settings.with_stack)
            self._prof.__enter__()
        self._target = (Path(directory), name, settings)
        if settings.host:
            import cProfile

            self._host = cProfile.Profile()
            self._host.enable()

    def stop(self) -> dict | None:
        """Stop and write the files; the phases summary (None when no session was open, or
        with ``ops`` off)."""
        if self._target is None:
            return None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof, host, (directory, name, settings) = self._prof, self._host, self._target
        if host is not None:
            host.disable()
        if prof is not None:
            prof.__exit__(None, None, None)
        self._prof = self._host = self._target = None
        directory.mkdir(parents=True, exist_ok=True)
        if host is not None:
            (directory / f"{name}_host.txt").write_text(host_table(host, settings.top))
        if prof is None:
            logger.info("profile written to %s/%s_host.txt", directory, name)
            return None
        averages = prof.key_averages()
        on_device = torch.cuda.is_available()
        sort = "self_device_time_total" if on_device else "self_cpu_time_total"
        (directory / f"{name}.txt").write_text(averages.table(sort_by=sort, row_limit=settings.top) + "\n")
        summary = summarize(averages)
        (directory / f"{name}_phases.json").write_text(json.dumps(summary, indent=1) + "\n")
        if settings.trace:
            prof.export_chrome_trace(str(directory / f"{name}.trace.json.gz"))  # torch gzips a .gz path
        logger.info("profile written to %s/%s.*", directory, name)
        return summary


def host_table(profile, top: int) -> str:
    """A cProfile session's top ``top`` functions by own time, then by cumulative time."""
    import io
    import pstats

    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(profile, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
    return buf.getvalue()


def summarize(averages) -> dict:
    """``{"phases": {phase: {calls, cpu_ms, device_ms}}, "device_ms_by_kind": {...},
    "device_ms_total": ...}`` from the profiler's key averages."""
    phases: dict[str, dict[str, float]] = {}
    kinds: dict[str, float] = {}
    for avg in averages:
        if avg.key.startswith(PREFIX):
            entry = phases.setdefault(avg.key[len(PREFIX):], {"calls": 0, "cpu_ms": 0.0, "device_ms": 0.0})
            if avg.device_type == DeviceType.CPU:
                entry["calls"] += avg.count
                entry["cpu_ms"] += avg.cpu_time_total / 1e3
            entry["device_ms"] = max(entry["device_ms"], avg.device_time_total / 1e3)
        elif (avg.device_type != DeviceType.CPU and avg.self_device_time_total > 0
              and not getattr(avg, "is_user_annotation", False)):  # ranges over kernels, not kernels
            kind = kernel_kind(avg.key)
            kinds[kind] = kinds.get(kind, 0.0) + avg.self_device_time_total / 1e3
    return {"phases": phases, "device_ms_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "device_ms_total": sum(kinds.values())}

