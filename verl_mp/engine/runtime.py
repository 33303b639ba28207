"""Process-level runtime: device choice, torch.distributed start-up, megatron parallel state.

One object, `ParallelState`, carries the named parallel axes and is passed down
explicitly; nothing here stores the runtime rank in a config.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl_mp.config.parallel import ParallelConfig, validate_layout
from verl_mp.patches import megatron_cpu
from verl_mp.utils import net

logger = logging.getLogger(__name__)

# Re-exported so that engine code has one place to enter around megatron calls.
megatron_scope = megatron_cpu.megatron_scope


def has_cuda() -> bool:
    return torch.cuda.is_available()


def local_device() -> torch.device:
    """This rank's device: its GPU (LOCAL_RANK) with CUDA, else the CPU."""
    if has_cuda():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(timeout_minutes: int = 30) -> None:
    """Join the default process group from torchrun's environment (idempotent).

    NCCL on GPUs, gloo on CPU. A single process without torchrun variables becomes a
    world of one on loopback. Under torchrun the ranks use the store of torchrun's agent;
    otherwise (a world of one, Ray rank groups) rank 0 serves the store on ``MASTER_ADDR``'s
    address only, never on every interface (`verl_mp.utils.net.create_store`).
    """
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(net.reserve_port("127.0.0.1")))
    if has_cuda():
        torch.cuda.set_device(local_device())
        backend = "nccl"
    else:
        megatron_cpu.install()
        backend = "gloo"
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = net.create_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


@dataclass(frozen=True)
class ParallelState:
    """Named parallel axes of this rank (tp, pp, dp; for MoE layers ep, etp, edp) and their sizes.

    Routed experts use their own grid over the same ranks: expert-TP (``etp``) x expert
    parallel (``ep``) x expert data parallel (``edp``) x PP; everything else uses TP x DP x PP.
    """

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    vpp_size: int | None = None
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    edp_rank: int = 0
    edp_size: int = 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_output_rank(self) -> bool:
        """The rank whose results the driver collects: TP rank 0 of the last stage."""
        return self.is_last_stage and self.tp_rank == 0

    @property
    def tp_group(self):
        from megatron.core import parallel_state as mps

        return mps.get_tensor_model_parallel_group()

    @property
    def pp_group(self):
        from megatron.core import parallel_state as mps

        return mps.get_pipeline_model_parallel_group()

    @property
    def dp_group(self):
        from megatron.core import parallel_state as mps

        return mps.get_data_parallel_group()

    @property
    def ep_group(self):
        """The expert-parallel group (ranks of one stage holding different experts)."""
        from megatron.core import parallel_state as mps

        return mps.get_expert_model_parallel_group()

    @property
    def etp_group(self):
        """The expert-TP group (routed experts' linears are split over it)."""
        from megatron.core import parallel_state as mps

        return mps.get_expert_tensor_parallel_group()


def initialize_parallel(parallel: ParallelConfig, seed: int = 1234) -> ParallelState:
    """Start torch.distributed (if needed) and megatron's model-parallel groups."""
    from megatron.core import parallel_state as mps
    from megatron.core import tensor_parallel

    init_distributed()
    validate_layout(parallel, dist.get_world_size())
    if mps.model_parallel_is_initialized():
        mps.destroy_model_parallel()
    with megatron_scope():
        mps.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tensor_model_parallel_size,
            pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
            expert_model_parallel_size=parallel.expert_model_parallel_size,
            expert_tensor_parallel_size=parallel.expert_tp_size,
        )
        # Seeds the tracker that decides per-TP-rank dropout/initialisation streams.
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return current_parallel_state(parallel.virtual_pipeline_model_parallel_size)


def current_parallel_state(vpp_size: int | None = None) -> ParallelState:
    """The ParallelState of megatron's already-initialised groups."""
    from megatron.core import parallel_state as mps

    return ParallelState(
        tp_rank=mps.get_tensor_model_parallel_rank(),
        tp_size=mps.get_tensor_model_parallel_world_size(),
        pp_rank=mps.get_pipeline_model_parallel_rank(),
        pp_size=mps.get_pipeline_model_parallel_world_size(),
        dp_rank=mps.get_data_parallel_rank(),
        dp_size=mps.get_data_parallel_world_size(),
        vpp_size=vpp_size,
        ep_rank=mps.get_expert_model_parallel_rank(),
        ep_size=mps.get_expert_model_parallel_world_size(),
        etp_rank=mps.get_expert_tensor_parallel_rank(),
        etp_size=mps.get_expert_tensor_parallel_world_size(),
        edp_rank=mps.get_expert_data_parallel_rank(),
        edp_size=mps.get_expert_data_parallel_world_size(),
    )


def ensure_parallel(parallel: ParallelConfig, shape=None, seed: int = 1234, *,
                    trainable: bool = True) -> ParallelState:
    """Check the layout against the model shape, then reuse or start megatron's groups.

    Several engines in one process (actor + reference) share megatron's global parallel
    state, so they must use the same layout; a different one raises instead of silently
    re-initialising the groups under the first engine.
    """
    from megatron.core import parallel_state as mps

    init_distributed()
    validate_layout(parallel, dist.get_world_size(), shape, prefix="engine.parallel.", trainable=trainable)
    if not mps.model_parallel_is_initialized():
        return initialize_parallel(parallel, seed=seed)
    state = current_parallel_state(parallel.virtual_pipeline_model_parallel_size)
    have = (state.tp_size, state.pp_size, state.ep_size, state.etp_size)
    want = (parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size,
            parallel.expert_model_parallel_size, parallel.expert_tp_size)
    if have != want:
        raise ValueError(
            f"megatron is already initialised with (TP, PP, EP, expert-TP)={have}; engines in one "
            f"process must share the layout (got {want})"
        )
    return state


def destroy_parallel() -> None:
    from megatron.core import parallel_state as mps

    if mps.model_parallel_is_initialized():
        mps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
