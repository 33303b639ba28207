"""torchrun (SPMD) rank program: every rank builds its worker and runs the same loop.

Launched by `verl_mp.trainer.run` (``verl-mp train``) or by a multi-node launcher
(launch/slurm.sbatch) with ``--config RUN_DIR/config.yaml``: every rank reads the one
resolved configuration the driver validated and saved, and the run plan next to it
(``plan.yaml``: what this process hosts and how each engine is configured). Each rank
records its phase (`verl_mp.trainer.status`) so that a failure names the rank and phase.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

# No module-level torch import: a process that multiprocessing spawns (megatron's checkpoint
# writer starts a Manager at a rank's first save) imports this module as its __main__ first;
# torch would cost it ~2 s of start-up for nothing.


def _broadcast(obj):
    import torch.distributed as dist

    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def run(config_path: str) -> None:
    import torch.distributed as dist

    from verl_mp.config.loader import load_config
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.plan import load_plan
    from verl_mp.trainer.interrupt import stop_path
    from verl_mp.trainer.loop import RLTrainer
    from verl_mp.trainer.run import PLAN_FILE
    from verl_mp.trainer.setup import build_inputs
    from verl_mp.trainer.status import RankStatus
    from verl_mp.utils.launch import exit_cleanly_on_sigterm, exit_with_launcher
    from verl_mp.workers.groups import LocalGroup, WorkerGroups
    from verl_mp.workers.rank_worker import RankWorker

    exit_with_launcher()
    exit_cleanly_on_sigterm()
    cfg = load_config(config_path)  # also records its ${oc.env:...} keys, so none is written out
    plan = load_plan(os.path.join(os.path.dirname(config_path), PLAN_FILE))
    init_distributed()
    rank = dist.get_rank()
    status = RankStatus(cfg.trainer.default_local_dir, rank)
    worker = inputs = None
    try:
        worker = RankWorker(plan, "actor_rollout_ref")
        inputs = build_inputs(cfg, score_rewards=rank == 0)
        stop_file = stop_path(cfg.trainer.default_local_dir)
        trainer = RLTrainer(cfg, plan, inputs, WorkerGroups(plan, {"actor_rollout_ref": LocalGroup(worker)}),
                            rank=rank, broadcast=_broadcast, barrier=dist.barrier, on_phase=status.phase,
                            should_stop=lambda: _broadcast(os.path.exists(stop_file) if rank == 0 else None))
        trainer.fit()
        dist.barrier()
    except SystemExit:  # stopped by the launcher (SIGTERM) after another rank failed
        raise
    except BaseException as err:
        status.failed(err)
        raise
    finally:
        if worker is not None:
            worker.close()
        if inputs is not None and inputs.reward is not None:
            inputs.reward.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    # What `launch_local` gives the CPU ranks it starts (no torch.compile), for ranks another
    # launcher started (launch/slurm.sbatch's torchrun): before vLLM's import, which decorates.
    # Without it the Slurm torchrun job's first two generations compiled, 13.5 s and 16.6 s.
    from verl_mp.utils.launch import cpu_rank_env

    for key, value in cpu_rank_env().items():
        os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("RANK", "0") != "0":
        from verl_mp.utils.logs import NotRankZeroWarnings

        for handler in logging.getLogger().handlers:
            handler.addFilter(NotRankZeroWarnings())
    run(p.parse_args().config)
    _exit_now()


def _exit_now() -> None:
    """After a finished run (checkpoint saved, metrics and trackers closed, the rollout's shared
    memory and the reward workers released): end the process without the interpreter's
    teardown (vLLM's engine shutdown, multiprocessing managers joined, module and gloo
    destructors: ~6 s per run on 2 cores, and nothing left to write). Children started
    through multiprocessing hold this process's stderr; they are stopped first, or the
    launcher would wait for the pipe to close."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=10)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
