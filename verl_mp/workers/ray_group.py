"""Ray single-controller mode: one Ray actor per rank, each hosting a `HybridWorker`.

The driver calls a method on every actor (they run it collectively, like torchrun
ranks) and takes the result of rank 0 (every rank returns the same gathered result).
Actors join one torch.distributed world through env:// on a free local port.
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
        def __init__(self, cfg: RootConfig, rank: int, world: int, master_port: int, use_gpu: bool):
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0" if use_gpu else str(rank),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            from verl_mp.workers.hybrid import HybridWorker

            self.worker = HybridWorker(cfg)

        def ready(self) -> bool:
            return True

        def execute(self, method: str, *args, **kwargs):
            return getattr(self.worker, method)(*args, **kwargs)

    return _RankActor


class RayWorkerGroup:
    """Fans each call out to all rank actors; returns rank 0's result."""

    def __init__(self, cfg: RootConfig):
        import ray

        from verl_mp.utils.net import free_port

        n = cfg.trainer.world_size
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
        resources = {"num_gpus": 1, "num_cpus": 1} if use_gpu else {"num_cpus": 1}
        # Rank 0's actor hosts the rendezvous; on one node a free local port is enough.
        # (Multi-node Ray would need rank 0's address; this group places all ranks on the
        # driver's node today.)
        port = free_port()
        actor = _actor_class()
        self.actors = [actor.options(**resources).remote(cfg, r, n, port, use_gpu) for r in range(n)]
        ray.get([a.ready.remote() for a in self.actors])  # surfaces construction errors

    def _call(self, method: str, *args, **kwargs):
        import ray

        return ray.get([a.execute.remote(method, *args, **kwargs) for a in self.actors])[0]

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, *args, **kwargs)

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
