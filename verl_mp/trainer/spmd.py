"""torchrun (SPMD) entry: every rank builds its hybrid worker and runs the same loop.

Launched by `verl_mp.trainer.main` with ``--config RESOLVED.yaml`` so that every rank
reads the one resolved configuration the driver validated and saved.
"""

from __future__ import annotations

import argparse
import logging

import torch.distributed as dist


def _broadcast(obj):
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def run(config_path: str) -> None:
    from verl_mp.config.loader import load_config
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.trainer.loop import RLTrainer
    from verl_mp.trainer.setup import build_inputs
    from verl_mp.workers.hybrid import HybridWorker

    from verl_mp.utils.launch import exit_cleanly_on_sigterm, exit_with_launcher

    exit_with_launcher()
    exit_cleanly_on_sigterm()
    cfg = load_config(config_path)  # also records its ${oc.env:...} keys, so none is written out
    init_distributed()
    rank = dist.get_rank()
    worker = HybridWorker(cfg)
    inputs = build_inputs(cfg, score_rewards=rank == 0)
    trainer = RLTrainer(cfg, inputs, worker, rank=rank, broadcast=_broadcast, barrier=dist.barrier)
    try:
        trainer.fit()
        dist.barrier()
    finally:
        worker.close()
        if inputs.reward is not None:
            inputs.reward.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(p.parse_args().config)


if __name__ == "__main__":
    main()
