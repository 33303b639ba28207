"""`python -m verl_mp.trainer.main --config-name grpo key=value ...` (= `verl-mp train`).

Loads and validates the configuration before any process starts, saves the resolved
config with the run, then runs the loop in Ray single-controller mode or as torchrun SPMD
ranks (``trainer.launcher``). With no ``model.path`` it runs the embedded demo.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from verl_mp.config.loader import load_config, to_yaml

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-name", default="tiny_cpu",
                   help="preset in megatron_configs/ or a YAML path (default: tiny_cpu, the embedded demo)")
    p.add_argument("--prepare-only", action="store_true",
                   help="validate, prepare the demo if needed, write the resolved config, and stop "
                        "(multi-node launchers then start verl_mp.trainer.spmd on every node)")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. actor.optim.lr=1e-6")


def train(args) -> int:
    cfg = load_config(args.config_name, args.overrides)
    if not cfg.model.path:
        from verl_mp.trainer.demo import prepare_demo

        cfg = prepare_demo(cfg)
    from verl_mp.trainer.resume_check import preflight_resume
    from verl_mp.trainer.setup import preflight

    preflight(cfg)
    preflight_resume(cfg)
    out_dir = cfg.trainer.default_local_dir
    from verl_mp.utils.fs import DirLock

    # One run per directory: a second one is refused (DirLockedError, a ValueError) before it
    # overwrites config.yaml; the lock goes with this process. to_yaml writes no secrets.
    with DirLock(out_dir, purpose="a verl_mp run"):
        config_path = os.path.join(out_dir, "config.yaml")
        with open(config_path, "w") as f:
            f.write(to_yaml(cfg))
        logger.info("resolved config saved to %s\n%s", config_path, to_yaml(cfg))
        if args.prepare_only:
            print(config_path)
            return 0
        _launch(cfg, config_path)
    return 0


def _launch(cfg, config_path: str) -> None:
    if cfg.trainer.launcher == "torchrun" and cfg.trainer.nnodes > 1:
        raise ValueError(f"trainer.nnodes={cfg.trainer.nnodes}: start multi-node torchrun runs with "
                         "launch/slurm.sbatch (this command starts ranks on one machine), or use "
                         "trainer.launcher=ray on a Ray cluster (RAY_ADDRESS)")
    from verl_mp.utils import shm

    shm.ensure_run_id()  # inherited by every rank: one identity for the run's shared resources
    try:
        if cfg.trainer.launcher == "torchrun":
            from verl_mp.utils.launch import launch_local

            launch_local("verl_mp.trainer.spmd", cfg.trainer.nproc, ["--config", config_path])
        else:
            _run_ray(cfg)
    finally:
        shm.sweep_stale()  # what ranks that died could not release
    _finish(cfg)


def _run_ray(cfg) -> None:
    import ray

    from verl_mp.config.placement import resolve_placement
    from verl_mp.trainer.loop import RLTrainer
    from verl_mp.trainer.setup import build_inputs
    from verl_mp.workers.ray_group import build_ray_workers

    placement = resolve_placement(cfg)
    started_here = not ray.is_initialized()
    if started_here:
        _init_ray(cfg, placement)
    try:
        workers = build_ray_workers(cfg, placement)
        inputs = None
        try:
            inputs = build_inputs(cfg, score_rewards=True)
            RLTrainer(cfg, inputs, workers).fit()
        finally:
            if inputs is not None:
                inputs.reward.close()
            workers.shutdown()
    finally:
        if started_here:
            ray.shutdown()


def _init_ray(cfg, placement) -> None:
    """Join the cluster at RAY_ADDRESS, or start a local Ray with a CPU per rank of every pool.

    A local Ray serves on this machine's routable address (Ray binds no loopback-only mode),
    so it runs with token authentication and a fresh token of its own, kept in the
    environment of this run's processes (never written to ``~/.ray``). Joining a cluster
    without token authentication gets a warning (docs/security.md says how to turn it on).
    """
    import secrets

    import ray

    from verl_mp.utils.shm import RUN_ID_ENV, ensure_run_id

    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", RUN_ID_ENV: ensure_run_id()}}
    auth_mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if os.environ.get("RAY_ADDRESS"):
        if auth_mode != "token":
            logger.warning("joining the Ray cluster at %s without token authentication (RAY_AUTH_MODE is "
                           "not 'token'): whoever reaches its ports can run code in it; see docs/security.md",
                           os.environ["RAY_ADDRESS"])
        ray.init(runtime_env=runtime_env, log_to_driver=True)
        return
    if auth_mode == "disabled":
        logger.warning("RAY_AUTH_MODE=disabled: the local Ray of this run accepts anyone who reaches its "
                       "ports on this machine's network address; see docs/security.md")
    else:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        # Ray 2.60 caches its auth mode and token when it is imported; re-read them from the
        # environment (what its own tests do). Without it the driver is refused by its own GCS.
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    # address="local": without it, ray.init joins the cluster that `ray start` last started on
    # this machine (it finds its address file) and then refuses num_cpus.
    ray.init(address="local", num_cpus=max(placement.num_ranks, os.cpu_count() or 1),
             include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)


def _finish(cfg) -> None:
    from verl_mp.trainer.report import write_report

    metrics = os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl")
    if "jsonl" in cfg.trainer.logger and os.path.exists(metrics):
        summary = write_report(metrics, cfg.trainer.default_local_dir)
        logger.info("report written to %s: %s", cfg.trainer.default_local_dir, summary)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="verl_mp.trainer.main", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return train(p.parse_args(argv))
    except ValueError as exc:
        print(f"verl_mp.trainer.main: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
