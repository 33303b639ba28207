"""RankWorker: one process's share of a run, the roles its worker group hosts.

Built from the `RunPlan` (never the run config) and a group name. The
``actor_rollout_ref`` group is the colocated "hybrid engine": each process holds its
shards of the actor, the reference policy and the vLLM rollout engine, and the critic
and reward model unless they were placed on pools of their own; a split group hosts just
its role, with a torch.distributed world of its own. It runs the same under torchrun and
inside a Ray actor. Every method is collective over the group: all its processes call it
with the same arguments. The method set is `verl_mp.workers.protocol.RLWorker`.

Device memory is handed over in a fixed order every step (GPU): generation offloads what
the plan says of the actor, frees cached allocator blocks, wakes vLLM, generates, puts
vLLM to sleep and brings the actor back; the reference policy is loaded only for its
forward pass when its parameters are offloaded.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import torch
import torch.distributed as dist

from verl_mp.bridge.weight_sync import make_weight_sync, push_weights
from verl_mp.config.profile import ProfileConfig
from verl_mp.data.rl_batch import RLBatch
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import local_device
from verl_mp.plan import RunPlan
from verl_mp.reward.reward_model import SequenceScorer
from verl_mp.rollout import build_rollout
from verl_mp.rollout.types import RolloutOutput
from verl_mp.utils import memory, profiling, stopwatch
from verl_mp.utils.dtypes import TORCH_DTYPES
from verl_mp.utils.fs import disk_full_error
from verl_mp.workers import rollout_link
from verl_mp.workers.batch_io import engine_inputs, response_values, train_epochs
from verl_mp.workers.faults import FaultInjector
from verl_mp.workers.losses import actor_loss, critic_loss
from verl_mp.workers.protocol import ForwardRequest, ForwardResult, UpdateRequest

logger = logging.getLogger(__name__)


def _phase(method):
    """Run a worker phase under its profiler label (``verl_mp/<method>``; `trainer.profile`)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with profiling.phase(method.__name__):
            return method(self, *args, **kwargs)
    return run


class RankWorker:
    def __init__(self, plan: RunPlan, group: str):
        self.plan, self.group = plan, group
        self.roles = list(plan.groups[group].roles)
        self.faults = FaultInjector(dist.get_rank())
        self.actor = self.ref = self.critic = self.rollout = self.sync = self.scorer = None
        if "actor" in self.roles:
            self.actor = _load(MegatronEngine(plan.actor))
        if "ref" in self.roles:
            self.ref = _load(MegatronEngine(plan.ref))
            self._offload(self.ref)
        if "critic" in self.roles:
            self.critic = _load(MegatronEngine(plan.critic))
        if "reward_model" in self.roles:
            self.scorer = _reward_model(plan)
        self.profiler = profiling.StepProfiler()
        self.channel = None
        """The weight channel of a rollout on ranks of its own (`open_weight_channel`)."""
        if "rollout" in self.roles:  # on a pool of its own, no engine to ask: the model's config
            spec = self.actor.spec if self.actor is not None else rollout_link.model_spec(plan.model_path)
            self.rollout = build_rollout(plan.rollout, plan.model_path, spec.num_query_groups, moe=spec.moe is not None,
                                         record_routing=plan.router_replay == "rollout",
                                         max_positions=spec.max_position_embeddings)
        if self.actor is not None and self.rollout is not None:
            self.sync = make_weight_sync(self.actor.spec, self.actor.chunks, self.actor.state,
                                         plan.rollout.weight_sync_bucket_mb, plan.rollout.weight_sync_mode,
                                         self.rollout)
        elif self.actor is not None and plan.has("rollout"):  # it sends to a rollout on a pool of its own
            self.sync = rollout_link.actor_sync(plan, self.actor)

    # -- rollout --------------------------------------------------------------------------------
    @_phase
    def generate(self, prompt_ids: list[list[int]], sampling, record_routing: bool = False,
                 carry=None) -> RolloutOutput:
        """``record_routing``: also each sequence's experts (``actor.router_replay=rollout``);
        ``carry``: a `CarryRequest` (``rollout.multi_turn.carry_over``)."""
        self.faults.check("generate")
        rollout = self._hosted(self.rollout, "rollout")
        metrics: dict[str, float] = {}
        parts = stopwatch.PhaseParts("generate")
        start = time.time()
        with memory.tracked("generate", metrics):
            if getattr(rollout, "weights_dropped", False) and self.sync is not None:
                # a level-2 sleep dropped vLLM's weights and no sync came since (validation, a greedy
                # baseline): write the actor's (the weights vLLM held) before the actor leaves the GPU
                with parts.part("resync"):
                    rollout.wake_up(["weights"])
                    push_weights(self.sync, rollout)
            with parts.part("free"):
                self._offload(self.actor)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()  # blocks the update cached: vLLM's KV cache needs them back
            with parts.part("wake"):
                rollout.wake_up()
            metrics.update(memory.snapshot("generate", "awake"))
            with parts.part("engine"), stopwatch.gc_seconds(metrics, "timing/generate_engine_gc_s",
                                                             "perf/generate_engine_gc_full_collections"):
                out = rollout.generate(prompt_ids, sampling, record_routing=record_routing, carry=carry)
            with parts.part("sleep"):
                if self.actor is not None:  # a rollout on ranks of its own keeps its memory
                    rollout.sleep()
            with parts.part("onload"):
                self._onload(self.actor)
        out.metrics.update(metrics, **parts.metrics())
        out.wall_start, out.wall_end = start, time.time()
        return out

    def open_weight_channel(self, host: str, port: int) -> None:
        """Join the channel that carries the actor's weights to a rollout on ranks of its own
        (collective over the actor's rank 0 and every rollout rank; others return)."""
        self.channel = rollout_link.open_channel(self.plan, self.sync if self.actor is not None else None, host, port)

    @_phase
    def sync_weights(self) -> dict[str, float]:
        """Actor shards -> rollout engine (bucketed; the prefix cache is reset). The weights
        stay awake; the KV cache wakes when generation starts. With the rollout on ranks of
        its own, the actor group sends and the rollout group receives (both are called)."""
        self.faults.check("sync_weights")
        if self.actor is None:
            return rollout_link.receive_weights(self._hosted(self.rollout, "rollout"), self.channel)
        if self.rollout is None:
            return rollout_link.send_weights(self._hosted(self.sync, "rollout"), self.channel)
        rollout = self._hosted(self.rollout, "rollout")
        metrics: dict[str, float] = {}
        parts = stopwatch.PhaseParts("weight_sync")  # wake the weights' memory + copy (as benchmarks/weight_sync.py times it)
        with memory.tracked("weight_sync", metrics):
            with parts.part("wake"):
                rollout.wake_up(["weights"])
            with parts.part("load"):
                push_weights(self.sync, rollout)
        stats = self.sync.last_stats
        return {**metrics, **parts.metrics(), "rollout/sync_bytes": float(stats.bytes_synced), "rollout/sync_buckets": float(stats.num_buckets),
                "rollout/sync_peak_transient_mb": stats.peak_transient_bytes / 2**20,
                "rollout/sync_gbps": stats.bytes_synced / max(stats.seconds, 1e-9) / 1e9,
                "rollout/sync_tp_gathered_bytes": float(stats.tp_gathered_bytes),
                "rollout/sync_ep_broadcast_bytes": float(stats.ep_broadcast_bytes),
                "rollout/sync_local": float(self.sync.kernel_format)}

    # -- forward passes ----------------------------------------------------------------------------
    @_phase
    def forward(self, batch: RLBatch, request: ForwardRequest) -> ForwardResult:
        """The requested per-token outputs of the hosted roles, from one conversion of the
        batch into the engines' layout."""
        self.faults.check("forward")
        inputs = engine_inputs(batch)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        result, t = ForwardResult(), self.plan.temperature
        with memory.tracked("forward", result.metrics):
            self._forward_roles(batch, request, ids, mask, t, result)
        return result

    def _forward_roles(self, batch, request, ids, mask, t, result) -> None:
        for role in request.roles():
            if role not in self.roles:
                continue
            name = {"actor": "old_log_prob", "ref": "ref", "critic": "values"}[role]
            start = time.perf_counter()
            with profiling.phase(name):
                self._forward_role(role, batch, ids, mask, t, result)
            result.metrics[f"timing/{name}_s"] = time.perf_counter() - start

    def _forward_role(self, role, batch, ids, mask, t, result) -> None:
        if role == "critic":
            result.values = response_values(batch, self.critic.compute_values(ids, mask))
        elif role == "actor":
            replay = self.plan.router_replay
            routing = batch.routed_experts if replay == "rollout" else None
            if replay == "rollout" and routing is None:
                raise ValueError("actor.router_replay=rollout: the batch has no routed_experts (the rollout "
                                 "did not record them)")
            lp = self.actor.compute_log_probs(ids, mask, temperature=t, routed_experts=routing,
                                              record_routing=replay == "old_logprob")
            result.old_log_probs = response_values(batch, lp)
            if replay == "old_logprob":
                result.routed_experts = self.actor.recorded_routing
        else:
            self._onload(self.ref)
            result.ref_log_probs = response_values(batch, self.ref.compute_log_probs(ids, mask, temperature=t))
            self._offload(self.ref)

    @_phase
    def score(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts)]`` reward-model scores: each rank scores its share, all get all."""
        scorer = self._hosted(self.scorer, "reward_model")
        rank, world = dist.get_rank(), dist.get_world_size()
        parts: list = [None] * world
        dist.all_gather_object(parts, scorer.score(shard(texts, rank, world)))
        return torch.cat(parts)

    # -- updates -----------------------------------------------------------------------------------
    @_phase
    def update(self, batch: RLBatch, request: UpdateRequest) -> dict[str, float]:
        """The critic's epochs (on the values the forward phase computed), then the actor's."""
        self.faults.check("update")
        metrics: dict[str, float] = {}
        with memory.tracked("update", metrics):
            self._update_roles(batch, request, metrics)
        return metrics

    def _update_roles(self, batch: RLBatch, request: UpdateRequest, metrics: dict[str, float]) -> None:
        if request.critic and "critic" in self.roles:
            with profiling.phase("update_critic"):
                self._update_critic(batch, metrics)
        if request.actor and "actor" in self.roles:
            with profiling.phase("update_actor"):
                self._update_actor(batch, metrics)

    def _update_critic(self, batch: RLBatch, metrics: dict[str, float]) -> None:
        start = time.perf_counter()
        batch.require("values", "returns")
        loss_cfg = self.plan.critic_loss
        metrics.update(train_epochs(self.critic, batch, ["values", "returns"], epochs=loss_cfg.ppo_epochs,
                                    mini_batch_size=self.plan.mini_batch_rows, prefix="critic",
                                    make_loss=lambda g, s, t: critic_loss(loss_cfg, g, s, t)))
        metrics["timing/update_critic_s"] = time.perf_counter() - start

    def _update_actor(self, batch: RLBatch, metrics: dict[str, float]) -> None:
        start = time.perf_counter()
        loss_cfg = self.plan.actor_loss
        if batch.old_log_probs is None and self.plan.old_log_probs_in_update:  # the update's own forward pass gives
            # them (and measures the gap); a batch with older samples came with them (`RLTrainer.step`)
            _check_one_optimizer_step(batch, self.plan.mini_batch_rows, loss_cfg.ppo_epochs)
            batch.require("advantages")
            fields = ["advantages"] + (["rollout_log_probs"] if batch.rollout_log_probs is not None else [])
        else:
            batch.require("old_log_probs", "advantages")
            fields = ["old_log_probs", "advantages"]
        fields += (["ref_log_probs"] if loss_cfg.use_kl_loss else []) \
            + (["rollout_weights"] if batch.rollout_weights is not None else [])
        if self.plan.router_replay != "off":
            batch.require("routed_experts")
        metrics.update(train_epochs(self.actor, batch, fields, epochs=loss_cfg.ppo_epochs,
                                    routing=self.plan.router_replay != "off",
                                    mini_batch_size=self.plan.mini_batch_rows, prefix="actor",
                                    make_loss=lambda g, s, t: actor_loss(loss_cfg, g, s, t),
                                    temperature=self.plan.temperature,
                                    with_entropy=loss_cfg.entropy_coeff != 0))
        metrics["timing/update_actor_s"] = time.perf_counter() - start

    # -- profiling ---------------------------------------------------------------------------------
    def start_profile(self, directory: str, settings: ProfileConfig) -> None:
        """Record this process's work until `stop_profile` if its rank is in ``settings.ranks``."""
        rank = dist.get_rank()
        if rank in settings.ranks:
            self.profiler.start(directory, f"{self.group}_rank{rank}", settings)

    def stop_profile(self) -> dict | None:
        """Write what was recorded (`verl_mp.utils.profiling`); the phases summary, or None."""
        return self.profiler.stop()

    # -- state -------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Writes ``directory/actor`` and ``directory/critic`` (the same wherever they run).

        A full disk, however deep in megatron's writer it was raised, comes out as a plain
        OSError with its errno: that survives the trip to a Ray driver (exception chains do
        not), which then reports the checkpoint that is intact, as torchrun ranks do."""
        for role, engine in (("actor", self.actor), ("critic", self.critic)):
            if engine is not None:
                path = os.path.join(directory, role)
                try:
                    engine.save_checkpoint(path)
                except BaseException as err:  # noqa: BLE001  (re-raised as it is unless the disk is full)
                    full = disk_full_error(err)
                    if full is None:
                        raise
                    raise OSError(full.errno, f"{os.strerror(full.errno)}, writing the {role} checkpoint to "
                                              f"{path} ({full})") from err

    def load_checkpoint(self, directory: str) -> None:
        for role, engine in (("actor", self.actor), ("critic", self.critic)):
            if engine is not None:
                engine.load_checkpoint(os.path.join(directory, role))

    def export_hf(self, directory: str) -> None:
        self._hosted(self.actor, "actor").export_hf(directory)

    def describe(self) -> dict:
        engines = {r: e.config for r, e in (("actor", self.actor), ("ref", self.ref), ("critic", self.critic))
                   if e is not None}
        info = {"group": self.group, "roles": self.roles, "world_size": dist.get_world_size(), "engines": engines,
                "backend": dist.get_backend(), "device": str(local_device()),
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        if self.actor is not None:
            info["flop_params"] = flop_params(self.actor.spec)
            moe = self.actor.spec.moe
            if moe is not None:  # what routed-experts tables must match (`verl_mp.models.routing`)
                info["routing"] = {"num_layers": self.actor.spec.num_layers, "num_experts": moe.num_experts,
                                   "top_k": moe.top_k}
        return info

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _hosted(component, role: str):
        if component is None:
            raise ValueError(f"this worker hosts no {role} (disabled, or placed on another pool)")
        return component

    @staticmethod
    def _offload(engine: MegatronEngine | None) -> None:
        """Move what the engine's config says off the device (GPU only)."""
        if engine is not None and torch.cuda.is_available() and not engine.offloaded:
            engine.offload()

    @staticmethod
    def _onload(engine: MegatronEngine | None) -> None:
        if engine is not None and engine.offloaded:
            engine.onload()


def _load(engine: MegatronEngine) -> MegatronEngine:
    engine.load_hf()
    return engine


def _reward_model(plan: RunPlan):
    rm = plan.reward_model
    return SequenceScorer.from_pretrained(rm.path, dtype=TORCH_DTYPES[rm.dtype], device=local_device(),
                                          max_length=rm.max_length, batch_size=rm.micro_batch_size)


def shard(items: list, rank: int, world: int) -> list:
    """Rank ``rank``'s contiguous share of ``items`` (sizes differ by at most one); the
    shares of ranks 0..world-1, concatenated, are ``items`` in order."""
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start:start + base + (rank < extra)])


def flop_params(spec) -> int:
    """Matmul parameters per token of a forward pass, without the input embedding (FLOP
    estimates: 2 x this x tokens forward, 6 x for training). Mixture of experts: the active
    ones (each token's ``top_k`` experts, the shared expert, the router)."""
    h = spec.hidden_size
    per_layer = (h * spec.head_dim * (spec.num_attention_heads + 2 * spec.num_query_groups)
                 + spec.num_attention_heads * spec.head_dim * h)
    m = spec.moe
    if m is None:
        per_layer += 3 * h * spec.ffn_hidden_size
    else:
        per_layer += 3 * h * (m.top_k * m.ffn_hidden_size + (m.shared_expert_ffn_hidden_size or 0)) + h * m.num_experts
    return spec.num_layers * per_layer + spec.vocab_size * h


def _check_one_optimizer_step(batch: RLBatch, mini_batch_rows: int, epochs: int) -> None:
    """The plan takes the old log-probs from the update's forward pass only where the update is
    one optimizer step (`verl_mp.plan.old_log_probs_in_update`): a batch that would make more
    is a bug, not a setting."""
    if epochs != 1 or len(batch) > mini_batch_rows:
        raise RuntimeError(f"the old log-probs come from the update's forward pass, but this update makes more than "
                           f"one optimizer step ({len(batch)} samples in mini-batches of {mini_batch_rows}, {epochs} "
                           "epochs): set actor.old_log_probs=forward and report this")
