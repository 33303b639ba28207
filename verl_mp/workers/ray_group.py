"""Ray single-controller mode: one Ray worker group per pool, one Ray actor per rank.

`build_ray_workers` reads ``trainer.placement`` and starts a group for actor_rollout_ref
(`HybridWorker`: actor + reference + vLLM rollout, plus any role colocated with them),
and one for each role placed on a pool of its own: the critic (`CriticWorker`) and the
reward model (`RewardModelWorker`). A `RoleRouter` sends each call to its role's group.

Placement: a pool is one placement group with one bundle per node entry, and STRICT_SPREAD
puts every bundle on a node of its own: ``[8, 8]`` is two bundles of 8 CPUs (+ 8 GPUs when
the cluster has GPUs) on two different nodes. Each rank's actor takes 1 CPU (+ 1 GPU) of
its node's bundle. Ranks are numbered node entry by node entry. Start-up is two-phase so
that it also works on a multi-node Ray cluster: actors are created first, rank 0 reports
its node address and a free port, then every actor of the group joins that group's own
torch.distributed world there (so a split critic has its own world and its own Megatron
layout); each rank's Ray node id is logged.

Dispatch and collection (`RayWorkerGroup.__getattr__`), implicitly by DP rank and from
the output ranks: every rank receives the whole batch; each engine takes its own
data-parallel share itself (Megatron: by DP rank; vLLM: by rollout DP rank) and gathers
the results back onto every rank (Megatron: the last pipeline stage's outputs are
all-gathered over DP and broadcast along PP; train-step metrics are reduced over ranks).
So every rank ends with the full result that TP rank 0 of the last stage computed; only
rank 0 sends its copy to the driver, the others return None (their calls are still
awaited, so an error on any rank surfaces). The cost of this simplicity: the driver sends
the whole batch to every rank. `RayWorkerGroup.scatter` is the other mode, for per-item
work without collectives (reward-model scoring): rank r gets the r-th contiguous share of
the items, and every share comes back.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl_mp.config.placement import Placement, resolve_placement
from verl_mp.config.schema import RootConfig
from verl_mp.workers.router import RoleRouter

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 600.0
"""How long a pool may wait for Ray to find nodes for it before start-up fails."""

_WORKER_CLASSES = {
    "actor_rollout_ref": ("verl_mp.workers.hybrid", "HybridWorker"),
    "critic": ("verl_mp.workers.critic", "CriticWorker"),
    "reward_model": ("verl_mp.workers.reward_model", "RewardModelWorker"),
}


def _actor_class():
    import ray

    @ray.remote
    class _RankActor:
        def __init__(self, rank: int, world: int, local_rank: int):
            self.rank, self.world, self.local_rank, self.worker = rank, world, local_rank, None

        def address(self) -> tuple[str, int]:
            from ray.util import get_node_ip_address

            from verl_mp.utils.net import reserve_port

            # The group's store (served by this actor, rank 0) listens on loopback when the
            # cluster is this one machine, else on this node's address; the port stays held.
            host = "127.0.0.1" if sum(n["Alive"] for n in ray.nodes()) == 1 else get_node_ip_address()
            return host, reserve_port(host)

        def start(self, role: str, cfg: RootConfig, master_addr: str, master_port: int) -> str:
            """Builds this rank's worker; returns the Ray node id it runs on."""
            import importlib

            use_gpu = bool(ray.get_gpu_ids())  # Ray makes the rank's one GPU visible as cuda:0
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world),
                              LOCAL_RANK="0" if use_gpu else str(self.local_rank),
                              MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            module, name = _WORKER_CLASSES[role]
            self.worker = getattr(importlib.import_module(module), name)(cfg)
            return ray.get_runtime_context().get_node_id()

        def execute(self, method: str, *args, **kwargs):
            result = getattr(self.worker, method)(*args, **kwargs)
            return result if self.rank == 0 else None

        def execute_shard(self, method: str, items: list):
            from verl_mp.workers.reward_model import shard

            return getattr(self.worker, method)(shard(items, self.rank, self.world))

    return _RankActor


class RayWorkerGroup:
    """The Ray actors of one role on one pool (``node_counts``: ranks per node)."""

    def __init__(self, cfg: RootConfig, role: str, node_counts: list[int]):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role, self.world_size = role, sum(node_counts)
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
        self.pg = place_pool(role, node_counts, use_gpu)
        actor = _actor_class()
        self.actors = []
        for node, n in enumerate(node_counts):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                        placement_group_bundle_index=node)
            for local in range(n):
                self.actors.append(actor.options(num_cpus=1, num_gpus=1 if use_gpu else 0,
                                                 scheduling_strategy=strategy)
                                   .remote(len(self.actors), self.world_size, local))
        addr, port = ray.get(self.actors[0].address.remote())
        # start() surfaces build errors; each rank reports the Ray node it runs on
        self.node_ids = ray.get([a.start.remote(role, cfg, addr, port) for a in self.actors])
        for rank, node_id in enumerate(self.node_ids):
            logger.info("%s rank %d on node %s", role, rank, node_id)

    def __getattr__(self, method: str):
        """``group.method(...)``: a collective call on every rank; rank 0's result."""
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, *args, **kwargs)

    def _call(self, method: str, *args, **kwargs):
        import ray

        return ray.get([a.execute.remote(method, *args, **kwargs) for a in self.actors])[0]

    def scatter(self, method: str, items: list) -> list[Any]:
        """Rank r runs ``method`` on the r-th contiguous share of ``items``; the results in
        rank order."""
        import ray

        return ray.get([a.execute_shard.remote(method, items) for a in self.actors])

    def shutdown(self, close_timeout_s: float = 60.0) -> None:
        """Let every rank release what outlives its process (``close``), then kill the actors."""
        import ray
        from ray.util.placement_group import remove_placement_group

        pending = [a.execute.remote("close") for a in self.actors]
        try:
            ray.wait(pending, num_returns=len(pending), timeout=close_timeout_s)
        except Exception as err:  # noqa: BLE001  (a dead actor must not stop the teardown)
            logger.warning("%s: close before shutdown failed: %s", self.role, err)
        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)


def place_pool(role: str, node_counts: list[int], use_gpu: bool,
               timeout_s: float = PLACEMENT_TIMEOUT_S):
    """The placement group of a pool: bundle i holds node entry i's ranks (n CPUs, + n GPUs
    with ``use_gpu``) and every bundle is on a different node (STRICT_SPREAD). Raises
    RuntimeError, listing the cluster's nodes, when Ray cannot place it in ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": n, "GPU": n} if use_gpu else {"CPU": n} for n in node_counts]
    pg = placement_group(bundles, strategy="STRICT_SPREAD")
    if pg.wait(timeout_s):
        return pg
    remove_placement_group(pg)
    devices = "CPUs and GPUs" if use_gpu else "CPUs"
    totals = [{k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")}
              for n in ray.nodes() if n["Alive"]]
    raise RuntimeError(
        f"Ray could not place the {role} pool {node_counts} (ranks per node) within {timeout_s:.0f} s: "
        f"it needs {len(node_counts)} different nodes with that many {devices} free; the cluster's "
        f"alive nodes have {totals} in total (other pools or jobs may hold some). Add nodes, or give "
        "the pool fewer node entries (trainer.nnodes / trainer.placement.pools)")


def build_ray_workers(cfg: RootConfig, placement: Placement | None = None) -> RoleRouter:
    """One group per pool that hosts a role of this run; roles on the actor's pool are
    colocated in its HybridWorker processes."""
    from verl_mp.trainer.steps import needs_critic

    placement = placement or resolve_placement(cfg)
    groups: dict[str, RayWorkerGroup] = {}
    try:
        groups["actor_rollout_ref"] = RayWorkerGroup(cfg, "actor_rollout_ref", placement.node_counts("actor_rollout_ref"))
        for role, enabled in (("critic", needs_critic(cfg)), ("reward_model", cfg.reward_model.enable)):
            if enabled and not placement.colocated(role):
                logger.info("%s on its own pool %r: %s ranks", role, placement.roles[role], placement.node_counts(role))
                groups[role] = RayWorkerGroup(cfg, role, placement.node_counts(role))
    except BaseException:
        for group in groups.values():
            group.shutdown()
        raise
    return RoleRouter(groups["actor_rollout_ref"], critic=groups.get("critic"),
                      reward_model=groups.get("reward_model"))
