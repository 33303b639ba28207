"""Ray single-controller mode: one Ray actor per rank, each hosting a `HybridWorker`.

The driver calls a method on every actor (they run it collectively, like torchrun
ranks) and takes the result of rank 0 (every rank returns the same gathered result).

Placement: one placement group with a bundle per rank (1 CPU, plus 1 GPU when the
cluster has GPUs), packed onto as few nodes as possible; all engines of a rank are
colocated in its actor (the hybrid engine). Start-up is two-phase so that it also works
on a multi-node Ray cluster: actors are created first, rank 0 reports its node address
and a free port, then every actor joins one torch.distributed world at that address.
"""

from __future__ import annotations

import logging
import os

from verl_mp.config.schema import RootConfig

logger = logging.getLogger(__name__)


def _actor_class():
    import ray

    @ray.remote
    class _RankActor:
        def __init__(self, rank: int, world: int):
            self.rank, self.world, self.worker = rank, world, None

        def address(self) -> tuple[str, int]:
            from ray.util import get_node_ip_address

            from verl_mp.utils.net import free_port

            return get_node_ip_address(), free_port()

        def start(self, cfg: RootConfig, master_addr: str, master_port: int) -> bool:
            use_gpu = bool(ray.get_gpu_ids())
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world),
                              LOCAL_RANK="0" if use_gpu else str(self.rank),
                              MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            from verl_mp.workers.hybrid import HybridWorker

            self.worker = HybridWorker(cfg)
            return True

        def execute(self, method: str, *args, **kwargs):
            return getattr(self.worker, method)(*args, **kwargs)

    return _RankActor


class RayWorkerGroup:
    """Fans each call out to all rank actors; returns rank 0's result."""

    def __init__(self, cfg: RootConfig):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = cfg.trainer.world_size
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * n, strategy="PACK")
        ray.get(self.pg.ready())
        actor = _actor_class()
        self.actors = [
            actor.options(num_cpus=1, num_gpus=1 if use_gpu else 0,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                              placement_group=self.pg, placement_group_bundle_index=r)).remote(r, n)
            for r in range(n)
        ]
        addr, port = ray.get(self.actors[0].address.remote())
        ray.get([a.start.remote(cfg, addr, port) for a in self.actors])  # surfaces build errors

    def _call(self, method: str, *args, **kwargs):
        import ray

        return ray.get([a.execute.remote(method, *args, **kwargs) for a in self.actors])[0]

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, *args, **kwargs)

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)
