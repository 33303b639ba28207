"""The memory plan of a run: per-GPU bytes in every phase of a colocated PPO/GRPO step.

`plan_memory(cfg, spec)` takes the resolved `RootConfig` and the model's `GPTSpec` (from its
``config.json``) and returns a `MemoryPlan`: for each phase, the worst pipeline stage's bytes by
holder, what is asleep or offloaded, the peak phase, and whether it fits the GPU.

Phases of one step on the actor's pool (the order of `verl_mp.trainer.loop`):

- ``start``: engines built, then vLLM starts and takes its whole budget; the actor is on
  the GPU (with its Adam state when resumed), the reference offloaded if ``ref.offload``;
- ``generate``: vLLM awake (its budget); the actor and a colocated critic keep their
  state on the GPU unless ``actor.offload`` / ``critic.offload`` (the config's contract:
  parameters, gradients and optimizer state move to CPU while the rollout runs);
- ``old_log_prob``, ``ref_log_prob``, ``values``: forward-only passes, vLLM asleep;
- ``update_critic``, ``update_actor``: train steps (activations, LM head, optimizer step);
- ``sync``: vLLM's weights awake (its KV cache still released) plus the sync bucket (none
  where the sync copies in place).

A critic on its own pool (``trainer.placement``) gets its own phases (pool ``critic``).
A rollout on its own pool (``trainer.placement.roles.rollout``) leaves the actor's pool
without vLLM (no ``generate`` phase there; its ``sync`` adds the weight channel's send
buffers on rank 0) and gets phases of its own (pool ``rollout``): vLLM awake at its own TP
in ``start``, ``generate`` and ``sync`` (which adds the receive buffers), plus a reward
model placed on that pool.
By default PyTorch's cached blocks are released between phases (the hand-off of issue
21). With ``MemoryPlanOptions(cache_released=False)`` (today's trainer, which never empties the
cache) every phase after ``start`` also holds the largest transient of the step as cached
blocks (``cached``): what vLLM cannot get back when it wakes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from verl_mp.config.parallel import ParallelConfig, validate_layout
from verl_mp.config.placement import resolve_placement
from verl_mp.config.schema import RootConfig
from verl_mp.models.spec import GPTSpec
from verl_mp.engine.config import EngineConfig
from verl_mp.plan import build_plan, enabled_roles
from verl_mp.planner import memory as mem
from verl_mp.planner import rollout as ro
from verl_mp.planner.dims import Layout, ModelDims, total_params
from verl_mp.planner.engines import EngineUse, micro_batch_shape, train_micro_batches

GIB = 2**30
RUNTIME_OVERHEAD_BYTES = 2 * GIB
"""Device memory the torch allocator does not see: CUDA context, cuBLAS workspaces, NCCL
communicator buffers, allocator fragmentation. An estimate (not calibrated): the
calibration compares the allocator's peak (`max_memory_allocated`) without it."""


@dataclass(frozen=True, kw_only=True)
class MemoryPlanOptions:
    gpu_memory_gib: float = 80.0
    """Memory of one GPU (GiB as the driver reports it: H100 80 GB ~ 79.6, H200 ~ 140.4)."""
    logprob_impl: str = "fused"
    """``fused`` (the Triton kernels, the engine's default on CUDA: the log-prob op and the
    layers' RMSNorm and SwiGLU) or ``torch`` (``VERL_MP_KERNELS=torch``)."""
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES
    cache_released: bool = True
    """PyTorch's cached blocks are released before vLLM wakes (issue 21's hand-off); False
    models a trainer that keeps them (the largest transient of the step stays reserved)."""
    tight_fraction: float = 0.95
    """Phases above this share of the GPU are flagged: allocator fragmentation and the
    estimated overheads make the outcome uncertain there."""

    @property
    def gpu_bytes(self) -> int:
        return int(self.gpu_memory_gib * GIB)


@dataclass(frozen=True)
class PhaseMemory:
    name: str
    pool: str
    stage: int
    """The pipeline stage with the most memory in this phase."""
    parts: dict[str, int]
    """Bytes by holder: actor, ref, critic, reward_model, vllm, work (activations, logits,
    buffers of the running pass), overhead."""
    notes: str

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass
class MemoryPlan:
    gpu_bytes: int
    phases: list[PhaseMemory]
    problems: list[str] = field(default_factory=list)
    """Failures besides phase totals (e.g. vLLM's KV cache cannot hold one sequence)."""
    info: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)
    """role -> `EngineUse` of each engine, planned from the run plan's engine configs."""

    @property
    def peak(self) -> PhaseMemory:
        return max(self.phases, key=lambda ph: ph.total)

    @property
    def over(self) -> list[PhaseMemory]:
        return [ph for ph in self.phases if ph.total > self.gpu_bytes]

    @property
    def fits(self) -> bool:
        return not self.over and not self.problems

    def tight(self, fraction: float) -> list[PhaseMemory]:
        return [ph for ph in self.phases if fraction * self.gpu_bytes < ph.total <= self.gpu_bytes]


def layout_of(parallel: ParallelConfig, world: int, spec: GPTSpec, prefix: str) -> Layout:
    """The engine's layout on ``world`` ranks; invalid layouts raise preflight's errors."""
    dp = validate_layout(parallel, world, spec.shape, prefix=prefix)
    return Layout(tp=parallel.tensor_model_parallel_size, pp=parallel.pipeline_model_parallel_size,
                  vpp=parallel.virtual_pipeline_model_parallel_size, dp=dp, sp=parallel.sequence_parallel,
                  ep=parallel.expert_model_parallel_size,
                  etp=parallel.expert_tp_size if spec.moe is not None else None)


def plan_memory(cfg: RootConfig, spec: GPTSpec, options: MemoryPlanOptions = MemoryPlanOptions()) -> MemoryPlan:
    if options.logprob_impl not in mem.LOGPROB_IMPLS:
        raise ValueError(f"logprob_impl={options.logprob_impl!r} is not one of {mem.LOGPROB_IMPLS}")
    placement = resolve_placement(cfg.trainer, enabled_roles(cfg))
    dims = ModelDims.from_spec(spec)
    seq = cfg.data.max_prompt_length + cfg.rollout.sampling.max_new_tokens
    if cfg.rollout.multi_turn.enable:  # every turn and tool response of a conversation is one row
        seq = cfg.rollout.multi_turn.max_total_tokens
    world = cfg.trainer.world_size
    mini_rows = cfg.actor.ppo_mini_batch_size * cfg.rollout.sampling.n
    run_plan = build_plan(cfg, placement)  # the engines exactly as the ranks get them
    actor = _engine(cfg, run_plan.actor, dims, world, spec, seq, mini_rows)
    ref = _engine(cfg, run_plan.ref, dims, world, spec, seq, mini_rows) if run_plan.ref is not None else None
    critic = None
    if run_plan.critic is not None:
        critic = _engine(cfg, run_plan.critic, dims.critic(), placement.pool_size("critic"), spec, seq, mini_rows)
    critic_here = critic is not None and placement.colocated("critic")
    apart = not placement.colocated("rollout")
    rollout_world = placement.pool_size("rollout")
    rollout = _rollout_memory(cfg, dims, options, rollout_world)
    rm = _reward_model_bytes(cfg) if cfg.reward_model.enable else 0
    # the reward model is planned on the GPUs of the pool it shares with another role (the
    # plan hosts the roles of one pool in the same processes; preflight refuses a rollout pool
    # shared with anything, `verl-mp plan` still shows what it would take)
    rm_role_pool = placement.roles["reward_model"]
    rm_pool = "actor" if placement.colocated("reward_model") else \
        "critic" if critic is not None and not critic_here and rm_role_pool == placement.roles["critic"] else \
        "rollout" if apart and rm_role_pool == placement.roles["rollout"] else None
    ctx = _Context(cfg, options, actor, ref, critic if critic_here else None, None if apart else rollout,
                   rm if rm_pool == "actor" else 0, rollout_apart=apart)
    phases = [_worst_stage(ctx, name, actor.layout.pp) for name in _actor_pool_phases(ref, critic_here, apart)]
    if critic is not None and not critic_here:
        critic_ctx = _Context(cfg, options, None, None, critic, None, rm if rm_pool == "critic" else 0)
        phases += [_worst_stage(critic_ctx, name, critic.layout.pp, pool="critic")
                   for name in ("start", "values", "update_critic")]
    if apart:
        phases += _rollout_pool_phases(cfg, options, dims, rollout, rm if rm_pool == "rollout" else 0)
    if not options.cache_released:
        phases = _with_cached_blocks(phases)
    info = _info(cfg, dims, actor, critic, rollout, seq, rollout_world)
    if apart:
        info["rollout_pool"] = (placement.roles["rollout"], rollout_world)
    engines = {use.role: use for use in (actor, ref, critic) if use is not None}
    result = MemoryPlan(gpu_bytes=options.gpu_bytes, phases=phases, info=info, engines=engines)
    result.problems = _rollout_problems(cfg, rollout, info.get("rollout_pool")) \
        if cfg.rollout.backend == "vllm" else []
    return result


def _rollout_memory(cfg: RootConfig, dims: ModelDims, options: MemoryPlanOptions, world: int) -> ro.RolloutMemory:
    """Per-GPU bytes of the rollout engine on its ``world`` ranks (the actor's or its own pool)."""
    p = mem.DTYPE_BYTES[cfg.model.dtype]
    if cfg.rollout.backend != "vllm":
        return ro.hf_rollout_memory(dims, p)
    return ro.rollout_memory(dims, cfg.rollout.tensor_model_parallel_size, p, cfg.rollout.gpu_memory_utilization,
                             options.gpu_bytes, world=world, keep_weights=cfg.rollout.keep_weights_on_gpu)


def _rollout_pool_phases(cfg: RootConfig, options: MemoryPlanOptions, dims: ModelDims, rollout: ro.RolloutMemory,
                         reward_model: int) -> list[PhaseMemory]:
    """One rank of a rollout on its own pool: the engine alone, awake all the time (nothing
    else there needs its memory), and during a sync the channel's receive buffers. The
    overhead (CUDA context, vLLM's TP communicator and the channel's) is outside vLLM's
    budget, as on the actor's pool."""
    tp = cfg.rollout.tensor_model_parallel_size
    receive = ro.channel_receive_bytes(dims, tp, cfg.rollout.weight_sync_bucket_mb, mem.DTYPE_BYTES[cfg.model.dtype])
    awake = "vLLM awake" if rollout.sleeps else "HF rollout model resident"
    out = []
    for name in ("start", "generate", "sync"):
        parts = {"actor": 0, "ref": 0, "critic": 0, "reward_model": reward_model, "vllm": rollout.budget,
                 "work": receive if name == "sync" else 0, "overhead": options.overhead_bytes}
        notes = f"{awake} (rollout TP{tp})" + ("; weight channel receive buffers" if name == "sync" else "")
        out.append(PhaseMemory(name, "rollout", 0, parts, notes))
    return out


def _with_cached_blocks(phases: list[PhaseMemory]) -> list[PhaseMemory]:
    """Each pool's phases after ``start`` also hold, as cached blocks, the pool's largest
    transient beyond their own (steady state: the previous step's update left it reserved)."""
    out = []
    for ph in phases:
        largest = max(p.parts["work"] for p in phases if p.pool == ph.pool)
        parts = dict(ph.parts, cached=0 if ph.name == "start" else largest - ph.parts["work"])
        out.append(PhaseMemory(ph.name, ph.pool, ph.stage, parts, ph.notes))
    return out


def _engine(cfg: RootConfig, engine: EngineConfig, dims: ModelDims, world: int, spec: GPTSpec, seq: int,
            mini_rows: int) -> EngineUse:
    """The memory use of one engine of the run's plan (`verl_mp.plan.RunPlan`): its layout,
    micro-batching, recompute, offload and optimizer settings as its ranks receive them."""
    prefix = "critic.megatron." if engine.role == "critic" and cfg.critic.megatron is not None else "actor.megatron."
    layout = layout_of(engine.parallel, world, spec, prefix)
    micro = micro_batch_shape(engine, seq)
    return EngineUse(role=engine.role, dims=dims, layout=layout, dtype=engine.dtype, micro=micro,
                     train_micro_batches=train_micro_batches(mini_rows, layout.dp, micro),
                     recompute=mem.Recompute.of(engine), offload=engine.offload,
                     distributed_optimizer=engine.optim.use_distributed_optimizer, settings=engine)


def _actor_pool_phases(ref, critic_here: bool, rollout_apart: bool) -> list[str]:
    names = ["start"] + ([] if rollout_apart else ["generate"]) + ["old_log_prob"]
    if ref is not None:
        names.append("ref_log_prob")
    if critic_here:
        names += ["values", "update_critic"]
    return names + ["update_actor", "sync"]


@dataclass
class _Context:
    cfg: RootConfig
    options: MemoryPlanOptions
    actor: EngineUse | None
    ref: EngineUse | None
    critic: EngineUse | None
    rollout: ro.RolloutMemory | None
    """The rollout engine in these processes (None: none here)."""
    reward_model: int
    rollout_apart: bool = False
    """The rollout has a pool of its own: the sync sends over the weight channel."""


def _worst_stage(ctx: _Context, name: str, pp: int, pool: str = "actor") -> PhaseMemory:
    return max((_phase(ctx, name, stage, pool) for stage in range(pp)), key=lambda ph: ph.total)


def _phase(ctx: _Context, name: str, stage: int, pool: str) -> PhaseMemory:
    """Bytes by holder of phase ``name`` on one rank of pipeline stage ``stage``."""
    impl = ctx.options.logprob_impl
    a, r, c, ro_mem = ctx.actor, ctx.ref, ctx.critic, ctx.rollout
    generating = name in ("start", "generate")
    parts = {
        "actor": 0 if a is None else a.on_device(stage, away=name == "generate"),
        "ref": 0 if r is None else r.on_device(stage, away=name != "ref_log_prob"),
        "critic": 0 if c is None else c.on_device(stage, away=name == "generate"),
        "reward_model": ctx.reward_model,
        "vllm": 0,
        "work": 0,
        "overhead": ctx.options.overhead_bytes,
    }
    asleep = []
    if ro_mem is not None and not ro_mem.sleeps:
        parts["vllm"] = ro_mem.weights
        asleep.append("HF rollout model resident")
    elif ro_mem is not None:
        woken = ro_mem.weights if name == "sync" and not ro_mem.keeps_weights else 0
        parts["vllm"] = ro_mem.budget if generating else ro_mem.asleep + woken
        asleep.append("vLLM awake" if generating else "vLLM weights awake, KV cache released"
                      if name == "sync" or ro_mem.keeps_weights else "vLLM asleep")
    if name == "old_log_prob":
        parts["work"] = a.forward_peak(stage, impl)
    elif name == "ref_log_prob":
        parts["work"] = r.forward_peak(stage, impl)
    elif name == "values":
        parts["work"] = c.forward_peak(stage, impl)
    elif name in ("update_actor", "update_critic"):
        engine = a if name == "update_actor" else c
        entropy = name == "update_actor" and ctx.cfg.actor.entropy_coeff != 0
        parts["work"] = max(sum(engine.train_peak(stage, impl, entropy).values()),
                            engine.optimizer_step_transient(stage))
    elif name == "sync":
        parts["work"] = _sync_bytes(ctx, stage)
        if ctx.rollout_apart:
            asleep.append("weight channel send buffers on rank 0" if stage == 0 else "gather sync, no sender")
    return PhaseMemory(name, pool, stage, parts, "; ".join(asleep + _offload_notes(ctx, name)))


def _sync_bytes(ctx: _Context, stage: int) -> int:
    """The sync's transient on the actor's pool: the sync's bucket and gathers, plus, with the
    rollout on its own pool (always a ``gather`` sync there), the channel's send buffers on
    the actor's rank 0 (pipeline stage 0)."""
    a, r = ctx.actor, ctx.cfg.rollout
    apart_or_hf = ctx.rollout_apart or r.backend != "vllm"  # the HF backend loads full HF tensors only
    mode = "gather" if apart_or_hf else ro.sync_mode(r.weight_sync_mode, a.layout.tp, r.tensor_model_parallel_size)
    work = ro.sync_transient_bytes(a.dims, a.layout, mode, r.weight_sync_bucket_mb, a.p)
    if ctx.rollout_apart and stage == 0:
        work += ro.channel_send_bytes(a.dims, r.weight_sync_bucket_mb, a.p)
    return work


def _offload_notes(ctx: _Context, name: str) -> list[str]:
    notes = []
    if ctx.actor is not None and ctx.actor.offload.params and name == "generate":
        notes.append("actor offloaded")
    if ctx.critic is not None and ctx.critic.offload.params and name == "generate":
        notes.append("critic offloaded")
    if ctx.ref is not None:
        notes.append("ref on GPU" if name == "ref_log_prob" or not ctx.ref.offload.params else "ref offloaded")
    return notes


def _rollout_problems(cfg: RootConfig, rollout: ro.RolloutMemory, pool: tuple[str, int] | None) -> list[str]:
    """``pool``: (name, ranks) of the rollout's own pool (None: on the actor's GPUs)."""
    need = cfg.rollout.max_model_len
    if rollout.kv_tokens >= need:
        return []
    where = "" if pool is None else f"on the rollout pool {pool[0]!r} ({pool[1]} GPUs), "
    fix = "" if pool is None else (f"; raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size="
                                   f"{cfg.rollout.tensor_model_parallel_size} (fewer weights per GPU)")
    return [f"{where}vLLM's KV cache would hold {rollout.kv_tokens} tokens ({rollout.kv_cache / GIB:.1f} GiB = "
            f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} x GPU - weights "
            f"{rollout.weights / GIB:.1f} GiB - workspace {rollout.workspace / GIB:.1f} GiB), fewer than "
            f"rollout.max_model_len={need}: vLLM refuses to start{fix}"]


def _reward_model_bytes(cfg: RootConfig) -> int:
    """Weights of a colocated HF reward model (dense estimate from its config.json)."""
    path = os.path.join(cfg.reward_model.path, "config.json")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        d = json.load(f)
    h, f_, layers = d["hidden_size"], d["intermediate_size"], d["num_hidden_layers"]
    heads = d["num_attention_heads"]
    hd = d.get("head_dim") or h // heads
    kv = d.get("num_key_value_heads") or heads
    per_layer = h * hd * (2 * heads + 2 * kv) + 3 * h * f_ + 2 * h
    return (layers * per_layer + d["vocab_size"] * h) * mem.DTYPE_BYTES[cfg.reward_model.dtype]


def _info(cfg: RootConfig, dims: ModelDims, actor: EngineUse, critic: EngineUse | None,
          rollout: ro.RolloutMemory, seq: int, rollout_world: int) -> dict:
    rollout_dp = rollout_world // cfg.rollout.tensor_model_parallel_size
    rows_per_engine = math.ceil(cfg.data.train_batch_size * cfg.rollout.sampling.n / rollout_dp)
    info = {
        "params": total_params(dims),
        "rollout_backend": cfg.rollout.backend,
        "rollout_tp": cfg.rollout.tensor_model_parallel_size,
        "world": cfg.trainer.world_size,
        "actor_layout": actor.layout,
        "seq": seq,
        "actor_micro_tokens": actor.micro.tokens,
        "actor_micro_batches": actor.train_micro_batches,
        "kv_tokens": rollout.kv_tokens,
        "kv_cache": rollout.kv_cache,
        "rollout_rows_per_engine": rows_per_engine,
        "rollout_concurrency": rollout.kv_tokens // max(1, cfg.rollout.max_model_len),
    }
    if critic is not None:
        info["critic_layout"] = critic.layout
    return info
