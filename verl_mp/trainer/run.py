"""Start a run: validate everything, save the resolved config, run the loop, write the report.

Runs the driver loop in Ray single-controller mode or as torchrun SPMD ranks
(``trainer.launcher``). Every check that can fail runs before any process starts.
"""

from __future__ import annotations

import logging
import os
import time

from verl_mp.config.loader import to_yaml
from verl_mp.plan import save_plan
from verl_mp.trainer import status
from verl_mp.trainer.checkpoint_manager import checkpoint_step, is_complete
from verl_mp.trainer.interrupt import StopOnSignal, request_stop
from verl_mp.trainer.report import console_summary, write_report
from verl_mp.trainer.resume_check import preflight_resume
from verl_mp.trainer.setup import build_inputs, preflight
from verl_mp.utils import launch, procs, shm
from verl_mp.utils.errors import RunFailed, StopNow
from verl_mp.utils.fs import SHARED_TMPDIR_ENV, DirLock
from verl_mp.utils.logs import FollowFile, Heartbeat, is_console_line, log_to_file
from verl_mp.utils.shm import RUN_ID_ENV, ensure_run_id

logger = logging.getLogger(__name__)




def run(cfg, prepare_only: bool = False, verbose: bool = True) -> int:
    """``verbose=False``: the console shows the step lines, warnings and errors; the rest of
    every process's output goes to ``<run dir>/logs/`` (driver.log, ranks.log)."""
    plan = preflight(cfg)
    preflight_resume(cfg)
    out_dir = cfg.trainer.default_local_dir
    # One run per directory: a second one is refused (DirLockedError, a ValueError) before it
    # writes anything; the lock goes with this process. to_yaml writes no secrets.
    with DirLock(out_dir, purpose="a verl_mp run"):
        log_to_file(os.path.join(out_dir, "logs", "driver.log"))
        config_path = os.path.join(out_dir, "config.yaml")
        with open(config_path, "w") as f:
            f.write(to_yaml(cfg))
        save_plan(plan, os.path.join(out_dir, PLAN_FILE))
        logger.info("resolved config saved to %s (what each process runs: %s)", config_path, PLAN_FILE)
        logging.getLogger("verl_mp.trainer.config").info("resolved config:\n%s", to_yaml(cfg))  # log file only
        if prepare_only:
            print(config_path)
            return 0
        return _launch(cfg, plan, config_path, verbose)


def _launch(cfg, plan, config_path: str, verbose: bool) -> int:
    out_dir = cfg.trainer.default_local_dir
    if cfg.trainer.launcher == "torchrun" and cfg.trainer.nnodes > 1:
        raise ValueError(f"trainer.nnodes={cfg.trainer.nnodes}: start multi-node torchrun runs with "
                         "launch/slurm.sbatch (this command starts ranks on one machine), or use "
                         "trainer.launcher=ray on a Ray cluster (RAY_ADDRESS)")
    procs.reap_orphaned_runs()  # processes of runs whose driver was killed
    status.clear(out_dir)  # an earlier run's records: failure reports and the heartbeat read them
    run_id = procs.begin_run()  # inherited by every process of the run: its identity; locked
    started = time.monotonic()
    logs = [os.path.join(out_dir, "logs", name) for name in ("driver.log", RANKS_LOG)]
    with StopOnSignal(lambda: request_stop(out_dir)) as stop, RunTempDir() as tmp, \
            Heartbeat("still working", logs, where=lambda: status.where(out_dir)) as heartbeat:  # start-up, a long step
        try:
            if cfg.trainer.launcher == "torchrun":
                _run_torchrun(cfg, config_path, verbose, run_id)
            else:
                _run_ray(cfg, plan, stop, verbose, tmp)
        except KeyboardInterrupt:  # `StopNow`, or the plain KeyboardInterrupt Ray makes of it in ray.get
            raise StopNow(f"{stop.stop_now or 'Ctrl-C'}: stopped at once; {_kept(out_dir)}") from None
        finally:
            heartbeat.doing, heartbeat.where = "stopping the run's processes", lambda: ""
            procs.reap_run(run_id)  # what the ranks left (a killed rank's children)
            procs.end_run()
            shm.sweep_stale()  # what ranks that died could not release
    if stop.requested:
        logger.warning("stopped on request; trainer.resume_mode=auto continues from the checkpoint in %s", out_dir)
    _finish(cfg, started, stopped=stop.requested)  # the console's last line
    return 130 if stop.requested else 0


RANKS_LOG = "ranks.log"
"""In ``<run dir>/logs/``: every rank's full output (torchrun: through the launcher; Ray: each
rank's actor appends its stdout and stderr there, `redirect_output`)."""


MAX_TMP_BASE_CHARS = 24
"""Ray's socket path below the run's temp dir takes ~80 bytes of the 107 allowed."""


class RunTempDir:
    """A temporary directory of the run's own, removed at its end: the ``TMPDIR`` of every
    process the run starts (torchrun's ``torchelastic_*``, multiprocessing's ``pymp-*``: ranks
    end with ``os._exit`` and leave theirs) and a local Ray's ``--temp-dir`` (its session
    directory). Kept short under the system's temp dir rather than in the run directory:
    Ray and multiprocessing put Unix sockets there, whose paths may not exceed 107 bytes.
    Recorded next to the run's lock (`procs.record_temp_dir`): if the driver is killed
    (SIGKILL, out of memory) before removing it, the next run on this machine does."""

    def __init__(self):
        import tempfile

        base = tempfile.gettempdir()
        if len(base) > MAX_TMP_BASE_CHARS:  # Ray's sockets would not fit below it
            base = "/tmp"
        self.path = tempfile.mkdtemp(prefix=procs.RUN_TEMP_PREFIX, dir=base)
        procs.record_temp_dir(self.path)

    def __enter__(self) -> str:
        import tempfile

        self._previous = {k: os.environ.get(k) for k in ("TMPDIR", SHARED_TMPDIR_ENV)}
        os.environ.setdefault(SHARED_TMPDIR_ENV, tempfile.gettempdir())  # run locks, shm records
        os.environ["TMPDIR"] = self.path
        return self.path

    def __exit__(self, *exc_info) -> None:
        import shutil

        for key, value in self._previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.path, ignore_errors=True)


def _kept(out_dir: str) -> str:
    """What a run stopped at once keeps, and how to go on."""
    root = os.path.join(out_dir, "checkpoints")
    found = [(step, entry.name) for entry in (os.scandir(root) if os.path.isdir(root) else ())
             if (step := checkpoint_step(entry.name)) is not None and is_complete(entry.path)]
    if not found:
        return f"no checkpoint in {root} is complete (a new run starts from step 0)"
    step, name = max(found)
    return f"the last complete checkpoint, {name} (step {step}), stays; trainer.resume_mode=auto continues from it"


PLAN_FILE = "plan.yaml"
"""Next to config.yaml in the run directory: the `RunPlan` every process receives."""


def _run_torchrun(cfg, config_path: str, verbose: bool, run_id: str) -> None:
    import subprocess

    out_dir = cfg.trainer.default_local_dir
    try:
        launch.launch_local("verl_mp.cli.rank_train", cfg.trainer.nproc, ["--config", config_path],
                            stderr_log=os.path.join(out_dir, "logs", RANKS_LOG), own_session=True,
                            console_filter=None if verbose else is_console_line,
                            # a killed rank's children (its checkpoint writer, reward workers)
                            # would hold the ranks' output open: end them before reading it out
                            after_exit=lambda: procs.reap_run(run_id))
    except subprocess.CalledProcessError as err:
        raise RunFailed(status.failure_report(out_dir, err.stderr or "")) from None


def _run_ray(cfg, plan, stop, verbose: bool, temp_dir: str) -> None:
    import ray

    # lazy: only the Ray driver runs the loop here; the loop and the worker groups import the
    # engines (megatron) and Ray, ~0.5 s a torchrun driver does not need
    from verl_mp.trainer.loop import CheckpointWriteError, RLTrainer
    from verl_mp.workers.groups import WorkerError, WorkerGroups
    from verl_mp.workers.ray_group import build_ray_groups

    started_here = not ray.is_initialized()
    ranks_log = os.path.join(cfg.trainer.default_local_dir, "logs", RANKS_LOG)
    if started_here:
        _init_ray(cfg, plan, verbose, temp_dir, ranks_log)
        stop.reinstall()  # ray.init took SIGTERM (it would abort the driver without the checkpoint)
    follower = FollowFile(ranks_log, console_filter=None if verbose else is_console_line)
    try:
        try:
            workers = WorkerGroups(plan, build_ray_groups(plan))
        except WorkerError as err:
            raise RunFailed(f"{err} (start-up)") from err
        try:
            workers.open_weight_channel()
        except WorkerError as err:
            workers.shutdown()
            raise RunFailed(f"{err} (start-up: the weight channel to the rollout pool)") from err
        inputs = trainer = None
        try:
            inputs = build_inputs(cfg, score_rewards=True)
            trainer = RLTrainer(cfg, plan, inputs, workers, should_stop=lambda: stop.requested,
                                on_phase=status.RankStatus(cfg.trainer.default_local_dir, 0).phase)  # the heartbeat's
            trainer.fit()
        except (WorkerError, RunFailed, CheckpointWriteError) as err:
            # a rank's error, or the driver's: too many reward failures, a full disk at a checkpoint
            where = f"phase {trainer.phase_name} of step {trainer.step_no}" if trainer else "start-up"
            raise RunFailed(f"{err} ({where})") from err
        finally:
            if inputs is not None:
                inputs.reward.close()
            workers.shutdown(at_once=stop.stop_now)  # a second Ctrl-C: no waiting for the ranks
    finally:
        if started_here:
            ray.shutdown()
        follower.stop()


def _init_ray(cfg, plan, verbose: bool, temp_dir: str | None = None, ranks_log: str | None = None) -> None:
    """Join the cluster at RAY_ADDRESS, or start a local Ray with a CPU per rank of every pool.

    A local Ray serves on this machine's routable address (Ray binds no loopback-only mode),
    so it runs with token authentication and a fresh token of its own, kept in the
    environment of this run's processes (never written to ``~/.ray``). Joining a cluster
    without token authentication gets a warning (docs/security.md says how to turn it on).
    The ranks write their full output to ``ranks_log`` (`RANK_LOG_ENV`); the driver shows
    what the console should of it (`FollowFile`), so Ray's own log forwarding stays off. A
    local Ray keeps its session directory in ``temp_dir`` (removed at the run's end).
    """
    import secrets

    import ray

    from verl_mp.workers.ray_group import RANK_LOG_ENV  # lazy: see _run_ray

    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", RUN_ID_ENV: ensure_run_id()}}
    if not os.environ.get("RAY_ADDRESS"):  # a local Ray: its workers run on this machine
        runtime_env["env_vars"].update(launch.cpu_rank_env())
    if ranks_log:
        runtime_env["env_vars"][RANK_LOG_ENV] = os.path.abspath(ranks_log)
    level = logging.INFO if verbose else logging.WARNING
    auth_mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if os.environ.get("RAY_ADDRESS"):
        if auth_mode != "token":
            logger.warning("joining the Ray cluster at %s without token authentication (RAY_AUTH_MODE is "
                           "not 'token'): whoever reaches its ports can run code in it; see docs/security.md",
                           os.environ["RAY_ADDRESS"])
        ray.init(runtime_env=runtime_env, log_to_driver=False, logging_level=level)
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
    ranks = sum(g.world_size for g in plan.groups.values())
    ray.init(address="local", num_cpus=max(ranks, os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False, logging_level=level, runtime_env=runtime_env,
             **({"_temp_dir": temp_dir} if temp_dir else {}))


def _finish(cfg, started: float | None = None, stopped: bool = False) -> None:
    """summary.md and curves.png; the console's last line says in short what the run did."""
    out_dir = cfg.trainer.default_local_dir
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if "jsonl" in cfg.trainer.logger and os.path.exists(metrics):
        wall = time.monotonic() - started if started is not None else None
        summary = write_report(metrics, out_dir, wall_time_s=wall,
                               total_steps=cfg.trainer.total_steps, stopped=stopped)
        logging.getLogger("verl_mp.trainer.summary").info("summary: %s", summary)  # the log file only
        logger.info("%s", console_summary(summary, out_dir))
