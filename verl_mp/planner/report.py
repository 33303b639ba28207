"""Text rendering of a `MemoryPlan` (the output of ``verl-mp plan``)."""

from __future__ import annotations

from verl_mp.planner.memory_plan import GIB, MemoryPlan

COLUMNS = ("actor", "ref", "critic", "reward_model", "vllm", "work", "cached", "overhead")
HEADERS = ("actor", "ref", "critic", "rm", "vllm", "work", "cached", "other")


def gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def render(plan: MemoryPlan, title: str = "", tight_fraction: float = 0.95) -> str:
    """A per-phase table (GiB per GPU, the worst pipeline stage), the peak, and problems."""
    info = plan.info
    lay = info["actor_layout"]
    lines = []
    if title:
        lines.append(title)
    lines.append(f"model {info['params'] / 1e9:.2f}B params; {info['world']} GPUs of {gib(plan.gpu_bytes)} GiB; "
                 f"actor TP{lay.tp} x PP{lay.pp} x DP{lay.dp}{' +SP' if lay.sp else ''}; rows of "
                 f"{info['seq']} tokens, {info['actor_micro_tokens']:.0f} tokens per actor micro-batch, "
                 f"{info['actor_micro_batches']} micro-batches per optimizer step")
    if "critic_layout" in info:
        c = info["critic_layout"]
        lines.append(f"critic TP{c.tp} x PP{c.pp} x DP{c.dp}")
    if "rollout_pool" in info:
        name, ranks = info["rollout_pool"]
        lines.append(f"rollout on its own pool {name!r}: {ranks} GPUs, rollout TP{info['rollout_tp']} x "
                     f"DP{ranks // info['rollout_tp']}; the actor's pool holds no rollout engine")
    if info["rollout_backend"] == "vllm":
        lines.append(f"vLLM KV cache {gib(info['kv_cache'])} GiB = {info['kv_tokens']} tokens "
                     f"({info['rollout_concurrency']} full-length sequences at once; "
                     f"{info['rollout_rows_per_engine']} rows per rollout engine per step)")
    used = [(c, h) for c, h in zip(COLUMNS, HEADERS, strict=True)
            if c != "cached" or any(ph.parts.get(c, 0) for ph in plan.phases)]
    head = f"{'phase':<14} {'pool':<7} {'stage':>5} " + " ".join(f"{h:>6}" for _, h in used) + \
        f" {'total':>7} {'use':>5}   notes"
    lines += ["", "per-GPU memory (GiB) by phase, worst pipeline stage:", head, "-" * len(head)]
    for ph in plan.phases:
        cells = " ".join(f"{gib(ph.parts.get(c, 0)):>6}" for c, _ in used)
        flag = " !" if ph.total > plan.gpu_bytes else " ~" if ph.total > tight_fraction * plan.gpu_bytes else ""
        lines.append(f"{ph.name:<14} {ph.pool:<7} {ph.stage:>5} {cells} {gib(ph.total):>7} "
                     f"{ph.total / plan.gpu_bytes:>5.0%}{flag:2} {ph.notes}")
    peak = plan.peak
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines += ["", f"peak: {peak.name} ({peak.pool} pool, stage {peak.stage}) {gib(peak.total)} GiB of "
                  f"{gib(plan.gpu_bytes)} GiB -> {verdict}"]
    lines += [f"problem: {p}" for p in plan.problems]
    if plan.tight(tight_fraction):
        tight = [ph.name + ("" if ph.pool == "actor" else f" ({ph.pool} pool)") for ph in plan.tight(tight_fraction)]
        lines.append(f"~ tight: {', '.join(tight)} above "
                     f"{tight_fraction:.0%} of the GPU (fragmentation and the estimated overheads decide there)")
    return "\n".join(lines)


def render_suggestions(suggestions) -> str:
    if not suggestions:
        return "no single change found that lowers the peak; see docs/troubleshooting.md"
    lines = ["what to change (ranked; each re-planned, peak after the change):"]
    for i, s in enumerate(suggestions, 1):
        mark = "fits" if s.fits else "still over"
        lines.append(f"{i}. {s.summary}: peak {gib(s.peak_bytes)} GiB ({s.peak_phase}), {mark}")
        lines.append(f"     {' '.join(s.overrides)}")
    return "\n".join(lines)
