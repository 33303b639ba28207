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


def _pool_name(result: Plan, pool: str) -> str:
    """``critic pool`` / ``rollout pool 'gen' (2 GPUs)``."""
    if pool == "rollout" and "rollout_pool" in result.info:
        name, ranks = result.info["rollout_pool"]
        return f"rollout pool {name!r} ({ranks} GPUs)"
    return f"{pool} pool"
