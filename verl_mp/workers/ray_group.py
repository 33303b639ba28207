"""Ray single-controller mode: one Ray worker group per pool, one Ray actor per rank.

`build_ray_groups` starts one `RayWorkerGroup` for every group of the `RunPlan`: the
``actor_rollout_ref`` group (actor + reference + vLLM rollout, plus the roles colocated with
them) and one for each role placed on a pool of its own (a critic, a reward model). Each
rank's actor builds a `RankWorker` for its group's roles; `WorkerGroups`
(`verl_mp.workers.groups`) sends every phase to the groups that host its roles.

Placement: a pool is one placement group with one bundle per node entry, and STRICT_SPREAD
puts every bundle on a node of its own: ``[8, 8]`` is two bundles of 8 CPUs (+ 8 GPUs when
the cluster has GPUs) on two different nodes. Each rank's actor takes 1 CPU (+ 1 GPU) of
its node's bundle. Ranks are numbered node entry by node entry. Start-up is two-phase so
that it also works on a multi-node Ray cluster: actors are created first, rank 0 reports
its node address and a free port, then every actor of the group joins that group's own
torch.distributed world there (so a split critic has its own world and its own Megatron
layout); each rank's Ray node id is logged.

Data: a call's arguments are put into the object store once (``ray.put``) and every rank
reads them from there; each engine takes its own data-parallel share and gathers the
results onto every rank, so only rank 0 returns its copy (the others return None; their
calls are still awaited). A failing or dying rank surfaces at once as a `WorkerError`
naming the group, the rank and the call, while the other ranks may still be blocked in a
collective: the driver then tears the groups down.
"""

from __future__ import annotations

import logging
import os

from verl_mp.data.rl_batch import RLBatch
from verl_mp.plan import GroupPlan, RunPlan
from verl_mp.utils.logs import FORMAT
from verl_mp.utils.net import reserve_port
from verl_mp.workers.groups import WorkerError

logger = logging.getLogger(__name__)

RANK_LOG_ENV = "VERL_MP_RANK_LOG"
"""Where each rank's actor appends its full output (stdout and stderr: vLLM, Megatron, its
children's): the run directory's ``logs/ranks.log``, as under torchrun (`redirect_output`)."""

PLACEMENT_TIMEOUT_S = 600.0
"""How long a pool may wait for Ray to find nodes for it before start-up fails."""


def _actor_class():
    import ray

    @ray.remote
    class _RankActor:
        def __init__(self, rank: int, world: int, local_rank: int):
            self.rank, self.world, self.local_rank, self.worker = rank, world, local_rank, None
            redirect_output(os.environ.get(RANK_LOG_ENV))
            logging.basicConfig(level=logging.INFO, format=FORMAT)  # as torchrun's ranks log

        def address(self) -> tuple[str, int]:
            from ray.util import get_node_ip_address

            # The group's store (served by this actor, rank 0) listens on loopback when the
            # cluster is this one machine, else on this node's address; the port stays held.
            host = "127.0.0.1" if sum(n["Alive"] for n in ray.nodes()) == 1 else get_node_ip_address()
            return host, reserve_port(host)

        def start(self, plan: RunPlan, group: str, master_addr: str, master_port: int) -> str:
            """Builds this rank's worker; returns the Ray node id it runs on."""
            # lazy: the engines (megatron) load in this actor's process, never in the driver's
            from verl_mp.engine.runtime import init_distributed
            from verl_mp.workers.rank_worker import RankWorker

            use_gpu = bool(ray.get_gpu_ids())  # Ray makes the rank's one GPU visible as cuda:0
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world),
                              LOCAL_RANK="0" if use_gpu else str(self.local_rank),
                              MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            init_distributed()
            self.worker = RankWorker(plan, group)
            return ray.get_runtime_context().get_node_id()

        def execute(self, method: str, *args):
            result = getattr(self.worker, method)(*args)
            return result if self.rank == 0 else None

    return _RankActor


STUCK_GRACE_S = 3.0
"""After a rank failed a call: how long the other ranks get to finish it before they count as
blocked (in a collective with the failed rank) and are killed without ``close``."""


class RayWorkerGroup:
    """The Ray actors of one worker group (`GroupPlan`) on its pool."""

    def __init__(self, plan: RunPlan, group: GroupPlan):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name, self.world_size = group.name, group.world_size
        self.unfinished: dict[int, object] = {}
        """rank -> the call it was still running when another rank failed that call (a
        collective with the failed rank: it may never return)."""
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
        self.pg = place_pool(group.name, group.node_counts, use_gpu)
        actor = _actor_class()
        self.actors = []
        for node, n in enumerate(group.node_counts):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                        placement_group_bundle_index=node)
            for local in range(n):
                self.actors.append(actor.options(num_cpus=1, num_gpus=1 if use_gpu else 0,
                                                 scheduling_strategy=strategy)
                                   .remote(len(self.actors), self.world_size, local))
        addr, port = ray.get(self.actors[0].address.remote())
        self.node_ids = self.result((self.actors, [a.start.remote(plan, group.name, addr, port)
                                                   for a in self.actors], "start"), all_ranks=True)
        for rank, node_id in enumerate(self.node_ids):
            logger.info("%s rank %d on node %s", group.name, rank, node_id)

    def reserve_address(self) -> tuple[str, int]:
        """An address of rank 0's node and a port that rank 0 keeps listening on until it
        serves a store there (a channel to another group, `RLWorker.open_weight_channel`)."""
        import ray

        return ray.get(self.actors[0].address.remote())

    def submit(self, method, *args):
        """Start ``method`` (a `RLWorker` method) on every rank; the arguments travel once."""
        import ray

        refs = [ray.put(a) if _large(a) else a for a in args]
        return self.actors, [a.execute.remote(method.__name__, *refs) for a in self.actors], method.__name__

    def result(self, handle, all_ranks: bool = False):
        """Rank 0's result (every rank's with ``all_ranks``). The first failing rank raises
        `WorkerError` at once, without waiting for ranks blocked on it."""
        import ray

        _, refs, name = handle
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except Exception as err:  # noqa: BLE001  (re-raised with the rank and the call)
                rank = refs.index(ready[0])
                self.unfinished = {refs.index(ref): ref for ref in pending}
                raise WorkerError(f"{self.name} rank {rank} failed in {name}: {_summary(err)}") from err
        values = ray.get(refs)
        return values if all_ranks else values[0]

    def shutdown(self, close_timeout_s: float = 30.0) -> None:
        """Let every rank release what outlives its process (``close``), then kill the actors.
        Ranks still blocked in a collective (after another rank failed) are killed: a rank
        still running the failed call a moment later gets no ``close`` (an actor runs one call
        at a time: it would wait behind the blocked one for the whole timeout); the driver
        sweeps what it leaves (shared memory, child processes)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        stuck: set[int] = set()
        if self.unfinished:
            refs = list(self.unfinished.values())
            _, running = ray.wait(refs, num_returns=len(refs), timeout=min(close_timeout_s, STUCK_GRACE_S))
            stuck = {rank for rank, ref in self.unfinished.items() if ref in running}
        pending = [a.execute.remote("close") for rank, a in enumerate(self.actors) if rank not in stuck]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=close_timeout_s)
        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)


def redirect_output(path: str | None) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2: C++ and child
    processes' output too) to ``path``, appending; a no-op without a path. Ray's session
    directory, where they went, is temporary. On another node of a cluster the path is that
    node's own (its directory is created)."""
    if not path:
        return
    import sys

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _large(arg) -> bool:
    return isinstance(arg, RLBatch) or (isinstance(arg, list) and len(arg) > 64)


def _summary(err: Exception) -> str:
    """The first lines of a Ray error: the rank's own exception, not Ray's wrapper."""
    cause = getattr(err, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) if len(lines) > 3 else " | ".join(lines)


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


def build_ray_groups(plan: RunPlan) -> dict[str, RayWorkerGroup]:
    """One Ray worker group per group of the plan; on a failure those already started are
    shut down."""
    groups: dict[str, RayWorkerGroup] = {}
    try:
        for name, group in plan.groups.items():
            logger.info("worker group %s on pool %r: %s ranks, roles %s", name, group.pool, group.node_counts,
                        group.roles)
            groups[name] = RayWorkerGroup(plan, group)
    except BaseException:
        for group in groups.values():
            group.shutdown()
        raise
    return groups
