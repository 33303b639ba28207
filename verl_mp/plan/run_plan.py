"""`RunPlan` and `build_plan` (see the package doc)."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields, replace

from omegaconf import OmegaConf

from verl_mp.algo import estimator_spec
from verl_mp.config.checks import check_batch_sizes
from verl_mp.config.engine import EngineSettings, OffloadConfig, default_token_budget
from verl_mp.config.parallel import ParallelConfig, validate_layout
from verl_mp.config.placement import Placement, resolve_placement
from verl_mp.config.roles import ENGINE_ROLES, GROUPS, ROLES  # noqa: F401  (re-exported)
from verl_mp.config.rollout import RolloutConfig
from verl_mp.config.schema import (
    EngineRoleConfig,
    PolicyUpdateConfig,
    ReferenceConfig,
    RewardModelConfig,
    RootConfig,
    ValueUpdateConfig,
)
from verl_mp.engine.config import EngineConfig

@dataclass(kw_only=True)
class GroupPlan:
    """One worker group: the processes of one pool, one torch.distributed world."""

    name: str
    pool: str
    node_counts: list[int]
    """Ranks per node."""
    roles: list[str]
    """The roles every process of the group hosts (a subset of `ROLES`)."""

    @property
    def world_size(self) -> int:
        return sum(self.node_counts)


@dataclass(kw_only=True)
class RunPlan:
    model_path: str
    dtype: str
    """Training dtype; the rollout computes in it too."""
    seed: int
    groups: dict[str, GroupPlan] = field(default_factory=dict)
    """The groups of this run (only those hosting a role), by name (`GROUPS`)."""
    actor: EngineConfig
    ref: EngineConfig | None = None
    critic: EngineConfig | None = None
    rollout: RolloutConfig
    reward_model: RewardModelConfig | None = None
    actor_loss: PolicyUpdateConfig
    """The actor's loss settings (policy loss, clipping, aggregation, entropy, KL loss)."""
    critic_loss: ValueUpdateConfig
    router_replay: str = "off"
    """``actor.router_replay``: how the actor's passes route a mixture-of-experts model."""
    mini_batch_rows: int
    """Samples per optimizer step: actor.ppo_mini_batch_size prompts x rollout.sampling.n."""
    temperature: float
    """Sampling temperature the log-probs are computed at (1.0 for greedy sampling)."""
    old_log_probs_in_update: bool = False
    """The actor's update takes the PPO ratio's old log-probs from its own forward pass (and
    measures the rollout-vs-trainer gap there): no old-log-prob forward phase
    (`old_log_probs_in_update`)."""

    def group_of(self, role: str) -> str:
        """The name of the group hosting ``role``."""
        for name, group in self.groups.items():
            if role in group.roles:
                return name
        raise ValueError(f"this run has no {role}")

    def has(self, role: str) -> bool:
        return any(role in g.roles for g in self.groups.values())

    @property
    def rollout_apart(self) -> bool:
        """True when the rollout runs on ranks of its own (not in the actor's processes)."""
        return self.group_of("rollout") != self.group_of("actor")

    def engine(self, role: str) -> EngineConfig:
        config = getattr(self, role)
        if config is None:
            raise ValueError(f"this run has no {role} engine")
        return config


def critic_enabled(cfg: RootConfig) -> bool:
    """``critic.enable``, or when unset: whether the advantage estimator needs values."""
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return estimator_spec(cfg.algorithm.adv_estimator).needs_critic


def reference_enabled(cfg: RootConfig) -> bool:
    """A KL term (loss or reward penalty), or an estimator that reads reference log-probs."""
    a = cfg.algorithm
    return cfg.actor.use_kl_loss or a.use_kl_in_reward or estimator_spec(a.adv_estimator).needs_reference


def critic_layout(cfg: RootConfig) -> ParallelConfig:
    """``critic.megatron``, or the actor's layout when unset."""
    return cfg.critic.megatron if cfg.critic.megatron is not None else cfg.actor.megatron


def check_critic_layout(cfg: RootConfig, placement: Placement, spec) -> None:
    """The critic's layout (`critic_layout`) on its pool and the model (``spec``: its `GPTSpec`):
    a colocated critic uses the actor's."""
    if not critic_enabled(cfg):
        return
    if placement.colocated("critic"):
        if cfg.critic.megatron is not None and cfg.critic.megatron != cfg.actor.megatron:
            raise ValueError("critic.megatron differs from actor.megatron, but the critic is colocated with the "
                             "actor (one Megatron layout per process); remove critic.megatron or put the critic "
                             "on its own pool (trainer.placement.roles.critic)")
        return
    world = placement.pool_size("critic")
    try:
        dp = validate_layout(critic_layout(cfg), world, spec.shape, prefix="critic.megatron.")
    except ValueError as err:
        unset = " (critic.megatron is unset: the actor's layout applies)" if cfg.critic.megatron is None else ""
        raise ValueError(f"{err}; the critic pool {placement.roles['critic']!r} has {world} ranks{unset}") from None
    check_batch_sizes(cfg, dp, whose="the critic's ",
                      fix=f" (pool {placement.roles['critic']!r}); change the critic pool or critic.megatron")


def enabled_roles(cfg: RootConfig) -> dict[str, bool]:
    """Which placement groups have work in this run."""
    return {"actor_rollout_ref": True, "critic": critic_enabled(cfg), "reward_model": cfg.reward_model.enable,
            "rollout": True}


def build_plan(cfg: RootConfig, placement: Placement | None = None) -> RunPlan:
    """The plan of a checked configuration (`verl_mp.trainer.setup.preflight` checks it)."""
    placement = placement or resolve_placement(cfg.trainer, enabled_roles(cfg))
    use_critic, use_ref = critic_enabled(cfg), reference_enabled(cfg)
    horizon = _optimizer_steps(cfg)
    critic_parallel = critic_layout(cfg) if not placement.colocated("critic") else cfg.actor.megatron
    t = cfg.rollout.sampling.temperature
    return RunPlan(
        model_path=cfg.model.path, dtype=cfg.model.dtype, seed=cfg.trainer.seed,
        groups=_groups(placement, use_critic, use_ref, cfg.reward_model.enable),
        actor=_engine(cfg, "actor", cfg.actor, cfg.actor.megatron, horizon),
        ref=_engine(cfg, "ref", cfg.ref, cfg.actor.megatron, horizon) if use_ref else None,
        critic=_engine(cfg, "critic", cfg.critic, critic_parallel, horizon, cfg.critic.ppo_epochs)
        if use_critic else None,
        rollout=replace(cfg.rollout, dtype=cfg.model.dtype),
        reward_model=cfg.reward_model if cfg.reward_model.enable else None,
        actor_loss=_copy_fields(cfg.actor, PolicyUpdateConfig), critic_loss=_copy_fields(cfg.critic, ValueUpdateConfig),
        router_replay=cfg.actor.router_replay,
        mini_batch_rows=cfg.actor.ppo_mini_batch_size * cfg.rollout.sampling.n,
        temperature=t if t > 0 else 1.0,
        old_log_probs_in_update=old_log_probs_in_update(cfg),
    )


def old_log_probs_in_update(cfg: RootConfig) -> bool:
    """``actor.old_log_probs=auto`` where the old log-probs equal what the update's forward pass
    computes and nothing needs them before it: one optimizer step a step, on samples of the
    current weights, and no rollout correction, KL penalty in the reward, estimator input,
    routing recorded by the old-log-prob pass or ``rollout.logprob_diff_threshold`` (its check
    must come before the update). Then the separate forward pass is skipped. A step whose
    batch holds older samples (a resume from a run with off-policy steps) still runs it
    (`verl_mp.trainer.loop.RLTrainer.step`)."""
    a, actor, mt = cfg.algorithm, cfg.actor, cfg.rollout.multi_turn
    return (actor.old_log_probs == "auto" and actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size >= cfg.data.train_batch_size
            and cfg.trainer.off_policy_steps == 0 and not (mt.enable and mt.carry_over)
            and not a.rollout_correction.enabled and not a.use_kl_in_reward
            and "old_log_probs" not in estimator_spec(a.adv_estimator).inputs
            and actor.router_replay != "old_logprob" and cfg.rollout.logprob_diff_threshold is None)


def _copy_fields(section, cls):
    """The ``cls`` part of a config section (e.g. the actor's loss settings of ``actor``)."""
    return cls(**{f.name: copy.deepcopy(getattr(section, f.name)) for f in fields(cls)})


def _optimizer_steps(cfg: RootConfig, epochs: int | None = None) -> int:
    per_rl_step = (epochs or cfg.actor.ppo_epochs) * (cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size)
    return max(1, cfg.trainer.total_steps * per_rl_step)


def _engine(cfg: RootConfig, role: str, section: EngineRoleConfig | ReferenceConfig, parallel: ParallelConfig,
            horizon: int, epochs: int | None = None) -> EngineConfig:
    """Every `EngineSettings` field of ``section`` (actor, ref or critic), copied by name (the
    defaults of those a frozen reference has not: optimizer, recompute, offload of gradients and
    optimizer), plus what the run decides."""
    settings = {f.name: copy.deepcopy(getattr(section, f.name)) for f in fields(EngineSettings)
                if hasattr(section, f.name)}
    settings["offload"] = OffloadConfig(**asdict(section.offload))
    settings["max_tokens_per_micro_batch"] = _token_budget(cfg, section)
    return EngineConfig(
        **settings, model_path=cfg.model.path, role=role, dtype=cfg.model.dtype, parallel=parallel,
        total_training_steps=_optimizer_steps(cfg, epochs) if epochs else horizon, seed=cfg.trainer.seed,
        # The reference and a critic on a MoE body route with the actor's router settings.
        moe=cfg.actor.moe,
    )


def _token_budget(cfg: RootConfig, section: EngineRoleConfig | ReferenceConfig) -> int | None:
    """The role's token budget: as set (preflight fills an unset one with the planner's
    choice, `verl_mp.planner.choose`), else the fallback for a plan built without preflight."""
    if section.max_tokens_per_micro_batch is None and section.micro_batch_size is None:
        return default_token_budget(cfg.data.max_prompt_length + cfg.rollout.sampling.max_new_tokens)
    return section.max_tokens_per_micro_batch


def _groups(placement: Placement, use_critic: bool, use_ref: bool, use_rm: bool) -> dict[str, GroupPlan]:
    """The actor's group (with its reference and every colocated role) and one group per
    other pool, named after its first role: roles placed on one pool share its ranks (and
    GPUs), hosted by the same processes. A rollout on a pool of its own hosts vLLM alone
    (preflight refuses other roles on its pool)."""
    rollout_here = placement.colocated("rollout")
    groups = {"actor_rollout_ref": ["actor"] + (["rollout"] if rollout_here else []) + (["ref"] if use_ref else [])}
    by_pool = {placement.roles["actor_rollout_ref"]: "actor_rollout_ref"}
    for role, enabled in (("critic", use_critic), ("reward_model", use_rm), ("rollout", not rollout_here)):
        if enabled:
            name = by_pool.setdefault(placement.roles[role], role)
            groups.setdefault(name, []).append(role)
    return {name: GroupPlan(name=name, pool=placement.roles[name], node_counts=placement.node_counts(name),
                            roles=roles) for name, roles in groups.items()}


# -- plan.yaml ------------------------------------------------------------------------------------
def save_plan(plan: RunPlan, path: str) -> None:
    with open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.structured(plan)))


def load_plan(path: str) -> RunPlan:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunPlan), OmegaConf.load(path)))

