"""`check_fits`: the planner as a preflight check (refuse a run that cannot fit); the GPU a
run plans for (`run_gpu_memory_gib`) and the settings chosen for it (`choose_for_run`)."""

from __future__ import annotations

import logging

import torch

from verl_mp.config.schema import RootConfig
from verl_mp.models.spec import GPTSpec
from verl_mp.planner.advice import suggest
from verl_mp.planner.choose import choose
from verl_mp.planner.memory_plan import MemoryPlan, MemoryPlanOptions, plan_memory
from verl_mp.planner.report import gib

MAX_FIXES = 3

logger = logging.getLogger(__name__)


def run_gpu_memory_gib(cfg: RootConfig) -> float | None:
    """The GPU the run plans for: ``trainer.gpu_memory_gib``, else the local GPU's, else None."""
    if cfg.trainer.gpu_memory_gib is not None:
        return cfg.trainer.gpu_memory_gib
    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def choose_for_run(cfg: RootConfig, spec: GPTSpec) -> RootConfig:
    """What the run leaves to the planner (`verl_mp.planner.choose`), chosen for its GPU and
    logged; ``plan.yaml`` records it."""
    gib = run_gpu_memory_gib(cfg)
    cfg, choices = choose(cfg, spec, MemoryPlanOptions(gpu_memory_gib=gib) if gib is not None else None)
    for c in choices:
        logger.info("planner chose %s", c.line())
    return cfg


def check_run_fits(cfg: RootConfig, spec: GPTSpec) -> None:
    """`check_fits` on the GPUs the run will use (none known, or no vLLM rollout: no check),
    the error saying how to plan for others."""
    gib = run_gpu_memory_gib(cfg)
    if gib is None or cfg.rollout.backend != "vllm":
        return
    try:
        check_fits(cfg, spec, gib)
    except ValueError as err:
        raise ValueError(f"{err}; set trainer.gpu_memory_gib to plan for other GPUs") from None


def check_fits(cfg: RootConfig, spec: GPTSpec, gpu_memory_gib: float, *,
               logprob_impl: str = "fused", cache_released: bool = True) -> MemoryPlan:
    """Plan ``cfg`` on GPUs of ``gpu_memory_gib``; return the plan when it fits, else raise
    ValueError naming the phases that do not fit with their numbers and the best fixes
    (as overrides). ``cache_released=False`` plans for a trainer that keeps PyTorch's
    cached blocks across phases (before issue 21's hand-off)."""
    options = MemoryPlanOptions(gpu_memory_gib=gpu_memory_gib, logprob_impl=logprob_impl,
                          cache_released=cache_released)
    result = plan_memory(cfg, spec, options)
    if result.fits:
        return result
    raise ValueError(failure_message(result, suggest(cfg, spec, options, result)))


def failure_message(result: MemoryPlan, suggestions) -> str:
    parts = []
    for ph in result.over:
        held = ", ".join(f"{k} {gib(v)}" for k, v in ph.parts.items() if v)
        where = "" if ph.pool == "actor" else f" on the {_pool_name(result, ph.pool)}"
        parts.append(f"{ph.name}{where} needs {gib(ph.total)} GiB per GPU ({held}; {ph.notes})"
                     f"{_ROLLOUT_POOL_FIX if ph.pool == 'rollout' else ''}")
    msg = f"the run does not fit GPUs of {gib(result.gpu_bytes)} GiB: " + "; ".join(parts + result.problems)
    fixes = [f"[{' '.join(s.overrides)}] -> peak {gib(s.peak_bytes)} GiB{'' if s.fits else ' (still over)'}"
             for s in suggestions[:MAX_FIXES]]
    if fixes:
        msg += ". Fixes: " + "; ".join(fixes)
    return msg + " (verl-mp plan shows every phase)"


_ROLLOUT_POOL_FIX = (": vLLM alone takes rollout.gpu_memory_utilization x GPU there; lower "
                     "rollout.gpu_memory_utilization (raise rollout.tensor_model_parallel_size if its KV cache "
                     "then holds too few tokens)")


def _pool_name(result: MemoryPlan, pool: str) -> str:
    """``critic pool`` / ``rollout pool 'gen' (2 GPUs)``."""
    if pool == "rollout" and "rollout_pool" in result.info:
        name, ranks = result.info["rollout_pool"]
        return f"rollout pool {name!r} ({ranks} GPUs)"
    return f"{pool} pool"
