"""What to change when a plan does not fit: candidate overrides, each re-planned.

Every suggestion is a list of dotlist overrides (paste them after the command) that was
planned again and passed the layout and batch-size checks preflight runs. They are
ranked: changes that make the run fit first, then by kind in the order a user should
reach for them (raise TP/PP or turn on sequence parallelism; lower the micro-batch;
recompute activations; offload to CPU while generating; lower vLLM's memory share),
then by the peak they leave. When no single change fits, a greedy combination of up to
four changes is tried as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import OmegaConf

from verl_mp.config.checks import check_batch_sizes
from verl_mp.config.parallel import validate_layout
from verl_mp.config.placement import resolve_placement
from verl_mp.config.rollout import validate_rollout_layout
from verl_mp.config.engine import default_token_budget
from verl_mp.config.schema import RootConfig
from verl_mp.models.spec import GPTSpec
from verl_mp.plan import enabled_roles
from verl_mp.planner.memory_plan import MemoryPlan, MemoryPlanOptions, plan_memory

KINDS = ("parallelism", "micro-batch", "recompute", "offload", "rollout memory", "combined")
MAX_COMBINED = 4


@dataclass(frozen=True)
class Suggestion:
    kind: str
    summary: str
    overrides: tuple[str, ...]
    peak_bytes: int
    peak_phase: str
    fits: bool


def apply_overrides(cfg: RootConfig, overrides) -> RootConfig:
    merged = OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_object(merged)


def suggest(cfg: RootConfig, spec: GPTSpec, options: MemoryPlanOptions, base: MemoryPlan | None = None) -> list[Suggestion]:
    """Ranked suggestions that lower the peak of ``cfg``'s plan (empty if nothing helps)."""
    base = base or plan_memory(cfg, spec, options)
    evaluated = [_evaluate(cfg, spec, options, kind, summary, ovr)
                 for kind, summary, ovr in candidates(cfg, spec, base)]
    # within a kind the candidates come cheapest first (selective before full recompute)
    order = {s: i for i, s in enumerate(evaluated) if s is not None}
    found = [s for s in order if s.peak_bytes < base.peak.total or (s.fits and not base.fits)]
    found.sort(key=lambda s: (not s.fits, KINDS.index(s.kind), order[s]))
    if found and not any(s.fits for s in found):
        combined = _combine(cfg, spec, options, base)
        if combined is not None:
            found.insert(0, combined)
    return found


def candidates(cfg: RootConfig, spec: GPTSpec, base: MemoryPlan) -> list[tuple[str, str, list[str]]]:
    """(kind, summary, overrides) of every single change worth planning. Layout and
    recompute changes are for the actor (and what shares its layout); a critic on a pool
    of its own is not re-laid out here."""
    out = []
    a = cfg.actor.megatron
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    new_tp = tp * 2
    if spec.num_query_groups % new_tp == 0 and spec.num_attention_heads % new_tp == 0:
        ovr = [f"actor.megatron.tensor_model_parallel_size={new_tp}"]
        if cfg.rollout.tensor_model_parallel_size == tp and "rollout_pool" not in base.info:  # keep local sync
            ovr.append(f"rollout.tensor_model_parallel_size={new_tp}")
        out.append(("parallelism", f"raise actor TP to {new_tp}", ovr))
    if spec.num_layers % (pp * 2) == 0:
        out.append(("parallelism", f"raise actor PP to {pp * 2}",
                    [f"actor.megatron.pipeline_model_parallel_size={pp * 2}"]))
    if tp > 1 and not a.sequence_parallel:
        out.append(("parallelism", "turn on sequence parallelism", ["actor.megatron.sequence_parallel=true"]))
    for role in ("actor", "ref", "critic"):
        out += _micro_batch_candidates(cfg, role)
    if cfg.actor.recompute == "none":
        out.append(("recompute", "recompute the MLP (selective)", ["actor.recompute=selective",
                                                                   "actor.recompute_modules=[mlp]"]))
    if cfg.actor.recompute != "full":
        out.append(("recompute", "recompute every layer (full)", ["actor.recompute=full"]))
    for role in ("actor", "critic", "ref"):
        o = getattr(cfg, role).offload
        if not (o.params if role == "ref" else o.params and o.grads and o.optimizer):
            keys = ["params", "grads", "optimizer"] if role != "ref" else ["params"]
            out.append(("offload", f"offload the {role} while vLLM generates",
                        [f"{role}.offload.{k}=true" for k in keys]))
    util = _fitting_utilization(cfg, base)
    if util is not None:
        out.append(("rollout memory", f"lower vLLM's share to {util}", [f"rollout.gpu_memory_utilization={util}"]))
    rollout_tp = cfg.rollout.tensor_model_parallel_size * 2
    if base.problems and spec.num_query_groups % rollout_tp == 0:  # a KV cache too small for one sequence
        out.append(("rollout memory", f"raise rollout TP to {rollout_tp}",
                    [f"rollout.tensor_model_parallel_size={rollout_tp}"]))
    return out


def _micro_batch_candidates(cfg: RootConfig, role: str) -> list[tuple[str, str, list[str]]]:
    section = getattr(cfg, role)
    budget = section.max_tokens_per_micro_batch
    if budget is None and section.micro_batch_size is None:  # unset, planned at the fallback budget
        budget = default_token_budget(cfg.data.max_prompt_length + cfg.rollout.sampling.max_new_tokens)
    if budget is not None:
        half = budget // 2
        return [("micro-batch", f"halve {role}'s token budget per micro-batch",
                 [f"{role}.max_tokens_per_micro_batch={half}"])] if half >= 1 else []
    if section.micro_batch_size <= 1:
        return []
    half = section.micro_batch_size // 2
    return [("micro-batch", f"lower {role}.micro_batch_size to {half}", [f"{role}.micro_batch_size={half}"])]


def _fitting_utilization(cfg: RootConfig, base: MemoryPlan) -> float | None:
    """The largest gpu_memory_utilization (a multiple of 0.05) at which the phases with vLLM
    awake fit (start and generate; every phase of a rollout on its own pool), if lower than
    the current one."""
    apart = "rollout_pool" in base.info
    rollout_phases = [ph for ph in base.phases if (ph.pool == "rollout" if apart else
                                                   ph.pool == "actor" and ph.name in ("start", "generate"))]
    if not rollout_phases:
        return None
    others = max(ph.total - ph.parts["vllm"] for ph in rollout_phases)
    util = math.floor((base.gpu_bytes - others) / base.gpu_bytes * 20) / 20
    return util if 0 < util < cfg.rollout.gpu_memory_utilization else None


def _evaluate(cfg, spec, options, kind, summary, overrides) -> Suggestion | None:
    try:
        new = apply_overrides(cfg, overrides)
        _check_batches(new, spec)
        result = plan_memory(new, spec, options)
    except ValueError:  # an invalid layout or batch split: not a suggestion
        return None
    return Suggestion(kind, summary, tuple(overrides), result.peak.total, result.peak.name, result.fits)


def _check_batches(cfg: RootConfig, spec: GPTSpec) -> None:
    """The batch-size and rollout-layout checks of preflight that a layout change can break."""
    world = cfg.trainer.world_size
    check_batch_sizes(cfg, validate_layout(cfg.actor.megatron, world, spec.shape))
    placement = resolve_placement(cfg.trainer, enabled_roles(cfg))
    validate_rollout_layout(cfg.rollout, placement.pool_size("rollout"), spec.num_query_groups)


def _combine(cfg, spec, options, base: MemoryPlan) -> Suggestion | None:
    """Greedy combinations: first by the ranking's order of kinds (the user's order of
    preference), else by the lowest peak; the first that fits, or the lower one."""
    tries = [c for by_kind in (True, False) if (c := _greedy(cfg, spec, options, base, by_kind)) is not None]
    if not tries:
        return None
    return min(tries, key=lambda s: (not s.fits, tries.index(s) if s.fits else s.peak_bytes))


def _greedy(cfg, spec, options, base: MemoryPlan, by_kind: bool) -> Suggestion | None:
    """Apply the preferred change that lowers the peak, repeat until it fits."""
    applied: list[str] = []
    current, current_plan = cfg, base
    for _ in range(MAX_COMBINED):
        better = [s for kind, summary, ovr in candidates(current, spec, current_plan)
                  if (s := _evaluate(current, spec, options, kind, summary, ovr)) is not None
                  and s.peak_bytes < current_plan.peak.total]
        if not better:
            break
        key = (lambda s: (not s.fits, KINDS.index(s.kind), s.peak_bytes)) if by_kind else \
            (lambda s: (not s.fits, s.peak_bytes))
        best = min(better, key=key)
        applied += best.overrides
        current = apply_overrides(current, best.overrides)
        current_plan = plan_memory(current, spec, options)
        if current_plan.fits:
            break
    if not applied:
        return None
    return Suggestion("combined", "combine", tuple(applied), current_plan.peak.total, current_plan.peak.name,
                      current_plan.fits)
