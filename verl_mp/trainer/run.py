"""Start a run: validate everything, save the resolved config, run the loop, write the report.

Runs the driver loop in Ray single-controller mode or as torchrun SPMD ranks
(``trainer.launcher``). Every check that can fail runs before any process starts.
"""

from __future__ import annotations

import logging
import os

from verl_mp.config.loader import to_yaml
from verl_mp.trainer.interrupt import StopOnSignal, request_stop
from verl_mp.utils.errors import RunFailed
from verl_mp.utils.logs import is_console_line, log_to_file

logger = logging.getLogger(__name__)




def run(cfg, prepare_only: bool = False, verbose: bool = True) -> int:
    """``verbose=False``: the console shows the step lines, warnings and errors; the rest of
    every process's output goes to ``<run dir>/logs/`` (driver.log, ranks.log)."""
    from verl_mp.plan import save_plan
    from verl_mp.trainer.resume_check import preflight_resume
    from verl_mp.trainer.setup import preflight

    plan = preflight(cfg)
    preflight_resume(cfg)
    out_dir = cfg.trainer.default_local_dir
    os.makedirs(out_dir, exist_ok=True)
    log_to_file(os.path.join(out_dir, "logs", "driver.log"))
    config_path = os.path.join(out_dir, "config.yaml")
    with open(config_path, "w") as f:
        f.write(to_yaml(cfg))
    save_plan(plan, os.path.join(out_dir, PLAN_FILE))
    logger.info("resolved config saved to %s (what each process runs: %s)", config_path, PLAN_FILE)
    if prepare_only:
        print(config_path)
        return 0
    if cfg.trainer.launcher == "torchrun" and cfg.trainer.nnodes > 1:
        raise ValueError(f"trainer.nnodes={cfg.trainer.nnodes}: start multi-node torchrun runs with "
                         "launch/slurm.sbatch (this command starts ranks on one machine), or use "
                         "trainer.launcher=ray on a Ray cluster (RAY_ADDRESS)")
    from verl_mp.utils import shm

    shm.ensure_run_id()  # inherited by every rank: one identity for the run's shared resources
    with StopOnSignal(lambda: request_stop(out_dir)) as stop:
        try:
            if cfg.trainer.launcher == "torchrun":
                _run_torchrun(cfg, config_path, verbose)
            else:
                _run_ray(cfg, plan, stop, verbose)
        finally:
            shm.sweep_stale()  # what ranks that died could not release
    _finish(cfg)
    if stop.requested:
        logger.warning("stopped on request; trainer.resume_mode=auto continues from the checkpoint in %s", out_dir)
        return 130
    return 0


PLAN_FILE = "plan.yaml"
"""Next to config.yaml in the run directory: the `RunPlan` every process receives."""


def _run_torchrun(cfg, config_path: str, verbose: bool) -> None:
    import subprocess

    from verl_mp.trainer import status
    from verl_mp.utils.launch import launch_local

    out_dir = cfg.trainer.default_local_dir
    status.clear(out_dir)
    try:
        launch_local("verl_mp.cli.rank_train", cfg.trainer.nproc, ["--config", config_path],
                     stderr_log=os.path.join(out_dir, "logs", "ranks.log"), own_session=True,
                     console_filter=None if verbose else is_console_line)
    except subprocess.CalledProcessError as err:
        raise RunFailed(status.failure_report(out_dir, err.stderr or "")) from None


def _run_ray(cfg, plan, stop, verbose: bool) -> None:
    import ray

    from verl_mp.trainer.loop import RLTrainer
    from verl_mp.trainer.setup import build_inputs
    from verl_mp.workers.groups import WorkerError, WorkerGroups
    from verl_mp.workers.ray_group import build_ray_groups

    started_here = not ray.is_initialized()
    if started_here:
        _init_ray(cfg, plan, verbose)
    try:
        try:
            workers = WorkerGroups(plan, build_ray_groups(plan))
        except WorkerError as err:
            raise RunFailed(f"{err} (start-up)") from err
        inputs = trainer = None
        try:
            inputs = build_inputs(cfg, score_rewards=True)
            trainer = RLTrainer(cfg, plan, inputs, workers, should_stop=lambda: stop.requested)
            trainer.fit()
        except WorkerError as err:
            where = f"phase {trainer.phase_name} of step {trainer.step_no}" if trainer else "start-up"
            raise RunFailed(f"{err} ({where})") from err
        finally:
            if inputs is not None:
                inputs.reward.close()
            workers.shutdown()
    finally:
        if started_here:
            ray.shutdown()


def _init_ray(cfg, plan, verbose: bool) -> None:
    """Join the cluster at RAY_ADDRESS, or start a local Ray with a CPU per rank of every pool."""
    import ray

    from verl_mp.utils.shm import RUN_ID_ENV, ensure_run_id

    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", RUN_ID_ENV: ensure_run_id()}}
    level = logging.INFO if verbose else logging.WARNING  # quiet: worker output stays in Ray's log files
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env, log_to_driver=verbose, logging_level=level)
        return
    # address="local": without it, ray.init joins the cluster that `ray start` last started on
    # this machine (it finds its address file) and then refuses num_cpus.
    ranks = sum(g.world_size for g in plan.groups.values())
    ray.init(address="local", num_cpus=max(ranks, os.cpu_count() or 1),
             include_dashboard=False, log_to_driver=verbose, logging_level=level, runtime_env=runtime_env)


def _finish(cfg) -> None:
    from verl_mp.trainer.report import write_report

    metrics = os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl")
    if "jsonl" in cfg.trainer.logger and os.path.exists(metrics):
        summary = write_report(metrics, cfg.trainer.default_local_dir)
        logger.info("report written to %s: %s", cfg.trainer.default_local_dir, summary)
