"""The run plan: every decision about a run's processes, made once, before any starts.

`build_plan` runs in the driver's preflight, after the configuration was checked. It
decides which roles run (the critic when the advantage estimator needs values or
``critic.enable`` says so; the reference when a KL term needs it; the reward model), which
worker group hosts each role and on which pool, every Megatron engine's full
`EngineConfig` (layout, dtype, micro-batching, packing, attention backend, recompute,
offload, optimizer and its schedule horizon), the rollout settings (in the training
dtype), the loss settings and the mini-batch geometry.

Workers receive the plan, never the run configuration: the driver keeps that for what
only it does (data, rewards, logging, checkpoints). The plan is plain typed data: it is
saved as ``plan.yaml`` next to ``config.yaml`` (torchrun ranks load it from there; Ray
actors receive the object), so a user can read exactly what every process was told.
"""

from verl_mp.plan.run_plan import (
    ENGINE_ROLES,
    GROUPS,
    ROLES,
    GroupPlan,
    RunPlan,
    build_plan,
    check_critic_layout,
    critic_enabled,
    critic_layout,
    enabled_roles,
    load_plan,
    reference_enabled,
    save_plan,
)

__all__ = ["ENGINE_ROLES", "GROUPS", "ROLES", "GroupPlan", "RunPlan", "build_plan", "check_critic_layout",
           "critic_enabled", "critic_layout", "enabled_roles", "load_plan", "reference_enabled", "save_plan"]
