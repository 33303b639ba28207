"""`check_fits`: the planner as a preflight check (refuse a run that cannot fit)."""

from __future__ import annotations

from verl_mp.config.schema import RootConfig
from verl_mp.models.spec import GPTSpec
from verl_mp.planner.advice import suggest
from verl_mp.planner.plan import Plan, PlanOptions, plan
from verl_mp.planner.report import gib

MAX_FIXES = 3


def check_fits(cfg: RootConfig, spec: GPTSpec, gpu_memory_gib: float, *,
               logprob_impl: str = "fused", cache_released: bool = True) -> Plan:
    """Plan ``cfg`` on GPUs of ``gpu_memory_gib``; return the plan when it fits, else raise
    ValueError naming the phases that do not fit with their numbers and the best fixes
    (as overrides). ``cache_released=False`` plans for a trainer that keeps PyTorch's
    cached blocks across phases (before issue 21's hand-off)."""
    options = PlanOptions(gpu_memory_gib=gpu_memory_gib, logprob_impl=logprob_impl,
                          cache_released=cache_released)
    result = plan(cfg, spec, options)
    if result.fits:
        return result
    raise ValueError(failure_message(result, suggest(cfg, spec, options, result)))


def failure_message(result: Plan, suggestions) -> str:
    parts = []
    for ph in result.over:
        held = ", ".join(f"{k} {gib(v)}" for k, v in ph.parts.items() if v)
        parts.append(f"{ph.name} needs {gib(ph.total)} GiB per GPU ({held}; {ph.notes})")
    msg = f"the run does not fit GPUs of {gib(result.gpu_bytes)} GiB: " + "; ".join(parts + result.problems)
    fixes = [f"[{' '.join(s.overrides)}] -> peak {gib(s.peak_bytes)} GiB{'' if s.fits else ' (still over)'}"
             for s in suggestions[:MAX_FIXES]]
    if fixes:
        msg += ". Fixes: " + "; ".join(fixes)
    return msg + " (verl-mp plan shows every phase)"
