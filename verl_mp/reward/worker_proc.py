"""One reward worker process: limits, a clean environment, and the call loop.

The executor (`verl_mp.reward.executor`) starts ``python -m verl_mp.reward.worker_proc FD``
in a new session (so the worker leads a process group that also holds every process a
reward function starts) with the environment `worker_env` builds, and talks to it over the
socket ``FD`` (``multiprocessing.connection`` framing):

    parent -> worker   ("init", sys_path, WorkerLimits, timeout_s)
    worker -> parent   ("ready",)
    parent -> worker   pickled (fn, args), as bytes: unpickled here, so an import error
                       becomes that call's error instead of killing the worker; a tool
                       call (`verl_mp.reward.tool_pool`) is (fn, args, True)
    worker -> parent   ("started",), then ("done", status, score, extras, message, text)

Containment is against accidents and runaway code (a leak, a fork, a library that reads the
environment), not against a reward function written to attack the trainer: such code runs
as the same user (see docs/security.md).
"""

from __future__ import annotations

import fnmatch
import pickle
import resource
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from verl_mp.reward.call import call_safely
from verl_mp.utils.secrets import looks_secret

# Per-sample rule functions gain nothing from BLAS/OpenMP threads, and every thread's
# stack and malloc arena counts against the address-space limit.
_SINGLE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_NO_GPU = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """``resource.setrlimit`` values for each reward worker; None leaves a limit as it is."""

    memory_mb: int | None = 4096
    """RLIMIT_AS: address space. Past it allocations fail (MemoryError: the call errors)."""
    cpu_s: int | None = 3600
    """RLIMIT_CPU: CPU seconds over the worker's life (it is recycled after
    ``max_calls_per_worker`` calls); past it the kernel ends the worker (its call errors)."""
    open_files: int | None = 1024
    """RLIMIT_NOFILE: open file descriptors."""
    processes: int | None = None
    """RLIMIT_NPROC. Linux counts every process and thread of the *user*, not of the worker,
    and does not apply it to root, so it is off by default; set it only where reward
    workers run as a user of their own."""


def reward_limits(reward_cfg) -> WorkerLimits:
    """`WorkerLimits` from the ``reward`` config section (`verl_mp.config.schema.RewardConfig`)."""
    return WorkerLimits(memory_mb=reward_cfg.memory_limit_mb, cpu_s=reward_cfg.cpu_limit_s,
                        open_files=reward_cfg.max_open_files, processes=reward_cfg.max_processes)


WORKER_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
    "TMPDIR", "TMP", "TEMP", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE", "TORCH_HOME", *_SINGLE_THREAD,
})
"""Variables a reward worker gets from the trainer's environment: what a process needs to
run Python, find its files, libraries, locale and certificates. Everything else (database
URLs, webhooks, tokens of any name, proxies whose URL may hold a password) must be named in
``reward.pass_env``."""
WORKER_ENV_PREFIXES = ("LC_", "PYTHON", "VERL_MP_")
"""Prefixes passed as well: the locale, Python's own settings (PYTHONPATH, ...), this
project's (the run identity ``VERL_MP_RUN_ID``). A secret-looking name among them
(`verl_mp.utils.secrets.looks_secret`) still needs ``pass_env``."""


def worker_env(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The environment a worker starts with: the allowlist (`WORKER_ENV_NAMES`,
    `WORKER_ENV_PREFIXES`) plus what ``pass_env`` names (names, or ``fnmatch`` patterns such
    as ``JUDGE_*``); no GPU, one BLAS/OpenMP thread unless set."""
    patterns = list(pass_env)

    def allowed(name: str) -> bool:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return True
        listed = name in WORKER_ENV_NAMES or name.startswith(WORKER_ENV_PREFIXES)
        return listed and not looks_secret(name)

    env = {k: v for k, v in environ.items() if allowed(k)}
    env.update({name: "" for name in _NO_GPU})
    for name in _SINGLE_THREAD:
        env.setdefault(name, "1")
    return env


def apply_limits(limits: WorkerLimits) -> None:
    """Lower this process's soft and hard limits (never raises one above its hard limit)."""
    pairs = ((resource.RLIMIT_AS, limits.memory_mb and limits.memory_mb << 20),
             (resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_NOFILE, limits.open_files),
             (resource.RLIMIT_NPROC, limits.processes))
    for which, value in pairs:
        if value is None:
            continue
        _soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the soft limit ends the worker; SIGKILL 5 s later if it is caught
        new_hard = value + 5 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, new_hard if hard == resource.RLIM_INFINITY else min(new_hard, hard)))


def serve(conn) -> None:
    """Answer calls until the parent closes the connection."""
    _tag, sys_path, limits, timeout_s = conn.recv()
    sys.path[:] = sys_path  # what the parent can import (plugins on its sys.path), we can
    apply_limits(limits)
    conn.send(("ready",))
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        try:
            fn, args, *text = pickle.loads(data)  # (fn, args) or, for a tool, (fn, args, True)
        except Exception as err:  # noqa: BLE001  (a plugin that cannot be imported here)
            conn.send(("done", "error", 0.0, None, f"cannot load the reward call: {type(err).__name__}: {err}"))
            continue
        conn.send(("started",))
        outcome = call_safely(fn, args, timeout_s, text=bool(text and text[0]))
        conn.send(("done", outcome.status, outcome.score, outcome.extras, outcome.message, outcome.text))


def main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and ends the pool
    serve(Connection(int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
