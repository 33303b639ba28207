"""Resource pools and which pool hosts each role (Ray mode), plus the checks on them.

A pool is a named set of ranks: one entry per node, each the number of ranks (devices)
that node gives the pool, e.g. ``[8, 8]`` = 2 nodes x 8. The pool ``global`` is
``trainer.nnodes`` x ``[trainer.nproc]`` unless defined otherwise, and hosts every role
that is not mapped elsewhere. Roles on the pool of ``actor_rollout_ref`` are colocated in
its `RankWorker` processes; the roles on another pool get one Ray worker group there
(split placement), whose processes host them all (a critic and a reward model on one pool
share its ranks and devices). Example (PPO, critic on 4 ranks of its own)::

    trainer.placement.pools.critic=[4] trainer.placement.roles.critic=critic

The rollout (vLLM) may have a pool of its own too: it then runs at its own TP on those
ranks (alone: no other role may share its pool), receives the actor's weights after every
update over the collective backend, and may generate ahead of training
(``trainer.off_policy_steps``)::

    trainer.placement.pools.gen=[2] trainer.placement.roles.rollout=gen
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from verl_mp.config.roles import GROUPS

logger = logging.getLogger(__name__)

DEFAULT_POOL = "global"


@dataclass(kw_only=True)
class PlacementConfig:
    pools: dict[str, list[int]] = field(default_factory=dict)
    """Pool name -> ranks per node (one entry per node). ``global`` (trainer.nnodes x
    [trainer.nproc]) exists without being listed. The pool of actor_rollout_ref must have
    that shape: trainer.nproc and trainer.nnodes describe the actor's ranks."""
    roles: dict[str, str] = field(default_factory=dict)
    """Group (`verl_mp.config.roles.GROUPS`: actor_rollout_ref, critic, reward_model, rollout) -> pool
    name; the key says ``roles`` but names groups.
    actor_rollout_ref defaults to ``global``; critic, reward_model and rollout default to
    the actor's pool (colocated). A role on another pool needs trainer.launcher=ray."""


@dataclass(frozen=True)
class Placement:
    """The resolved placement: every pool's per-node ranks and every role's pool."""

    pools: dict[str, list[int]]
    roles: dict[str, str]

    def pool_size(self, role: str) -> int:
        return sum(self.pools[self.roles[role]])

    def node_counts(self, role: str) -> list[int]:
        return list(self.pools[self.roles[role]])

    def colocated(self, role: str) -> bool:
        """True when ``role`` runs inside the actor_rollout_ref processes."""
        return self.roles[role] == self.roles["actor_rollout_ref"]

    @property
    def num_ranks(self) -> int:
        return sum(sum(counts) for counts in self.pools.values())

    @property
    def multi_node(self) -> bool:
        return any(len(counts) > 1 for counts in self.pools.values())


def resolve_placement(t, enabled: dict[str, bool]) -> Placement:
    """``t``: the TrainerConfig; ``enabled``: which of `GROUPS` this run has
    (`verl_mp.plan.enabled_roles`). Fills the defaults and checks names and shapes; raises
    ValueError naming the setting and the fix. Model-dependent checks live in preflight."""
    spec = t.placement
    pools = {name: list(counts) for name, counts in spec.pools.items()}
    roles = {"actor_rollout_ref": DEFAULT_POOL, **spec.roles}
    if DEFAULT_POOL not in pools and DEFAULT_POOL in roles.values():
        pools[DEFAULT_POOL] = [t.nproc] * t.nnodes
    for name, counts in pools.items():
        if not counts or any(not isinstance(c, int) or c < 1 for c in counts):
            raise ValueError(f"trainer.placement.pools.{name}={counts}: give one positive rank count per node")
    for role, pool in roles.items():
        if role not in GROUPS:
            raise ValueError(f"trainer.placement.roles.{role}: unknown group; valid groups: {list(GROUPS)}")
        if pool not in pools:
            raise ValueError(f"trainer.placement.roles.{role}={pool!r} is not a pool; "
                             f"defined pools: {sorted(pools)} (add it under trainer.placement.pools)")
    for role in GROUPS:
        roles.setdefault(role, roles["actor_rollout_ref"])
    placement = Placement(pools=pools, roles=roles)
    _check_actor_pool(placement, t)
    _check_use(placement, t, enabled)
    return placement


def _check_actor_pool(placement: Placement, t) -> None:
    counts = placement.node_counts("actor_rollout_ref")
    expected = [t.nproc] * t.nnodes
    if counts != expected:
        raise ValueError(
            f"trainer.placement.pools.{placement.roles['actor_rollout_ref']}={counts} hosts actor_rollout_ref "
            f"but trainer.nnodes={t.nnodes} x trainer.nproc={t.nproc} is {expected}; make them agree "
            "(trainer.nproc and trainer.nnodes describe the actor's ranks)")


def _check_use(placement: Placement, t, enabled: dict[str, bool]) -> None:
    used = {placement.roles[r] for r in GROUPS if enabled.get(r)}
    unused = sorted(set(placement.pools) - used)
    if unused:
        raise ValueError(f"trainer.placement.pools {unused} host no role of this run (critic enabled: "
                         f"{enabled['critic']}, reward_model.enable: {enabled['reward_model']}); "
                         "remove them or map a role to them")
    for role in ("critic", "reward_model"):
        if not enabled.get(role) and role in t.placement.roles:
            logger.warning("trainer.placement.roles.%s has no effect: this run has no %s", role, role)
    split = [r for r in GROUPS if enabled.get(r) and not placement.colocated(r)]
    if split and t.launcher != "ray":
        raise ValueError(
            f"trainer.placement puts {split} on a pool apart from actor_rollout_ref, which needs "
            f"trainer.launcher=ray (trainer.launcher={t.launcher!r} runs every role on the "
            "same ranks); set trainer.launcher=ray or map those roles to the actor's pool")
