"""The colocated "hybrid engine" worker: one per rank, holding this rank's shards of
the actor, the reference policy, the critic (PPO) and the vLLM rollout engine.

A thin shell: it turns `RLBatch` objects into engine inputs (the ``[B, S]``
next-token layout) and calls the engines. It runs the same under torchrun and inside a
Ray actor. Every method is collective: all ranks call it with the same arguments.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import torch

from verl_mp.config.schema import RootConfig
from verl_mp.data.rl_batch import RLBatch, attention_mask, to_positions
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.rollout.types import RolloutOutput
from verl_mp.rollout.weight_sync import make_weight_sync
from verl_mp.trainer.steps import needs_critic, needs_reference
from verl_mp.workers.losses import actor_loss, critic_loss

logger = logging.getLogger(__name__)


class HybridWorker:
    def __init__(self, cfg: RootConfig):
        self.cfg = cfg
        self.actor = MegatronEngine(self._engine_config("actor"))
        self.actor.load_hf()
        self.spec = self.actor.spec
        self.ref = self.critic = None
        if needs_reference(cfg):
            self.ref = MegatronEngine(self._engine_config("ref"))
            self.ref.load_hf()
            self._maybe_offload(self.ref, cfg.ref.offload)
        if needs_critic(cfg):
            self.critic = MegatronEngine(self._engine_config("critic"))
            self.critic.load_hf()
        self.rollout = _build_rollout(cfg, self.spec.num_query_groups)
        self.sync = make_weight_sync(self.spec, self.actor.chunks, self.actor.state,
                                     cfg.rollout.weight_sync_bucket_mb, cfg.rollout.weight_sync_mode, self.rollout)

    def _engine_config(self, role: str) -> EngineConfig:
        cfg = self.cfg
        section = {"actor": cfg.actor, "ref": cfg.ref, "critic": cfg.critic}[role]
        epochs = cfg.critic.ppo_epochs if role == "critic" else cfg.actor.ppo_epochs
        steps_per_rl_step = epochs * (cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size)
        return EngineConfig(
            model_path=cfg.model.path, role=role, dtype=cfg.model.dtype, parallel=cfg.actor.megatron,
            optim=section.optim, total_training_steps=max(1, cfg.trainer.total_steps * steps_per_rl_step),
            micro_batch_size=section.micro_batch_size,
            max_tokens_per_micro_batch=section.max_tokens_per_micro_batch,
            attention_backend="auto", seed=cfg.trainer.seed,
        )

    # -- rollout ----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling) -> RolloutOutput:
        self._maybe_offload(self.actor, self.cfg.actor.offload)
        self.rollout.wake_up()
        out = self.rollout.generate(prompt_ids, sampling)
        self.rollout.sleep()
        self._maybe_onload(self.actor, self.cfg.actor.offload)
        return out

    def sync_weights(self) -> dict[str, float]:
        """Actor shards -> rollout engine (bucketed), then a fresh KV cache."""
        self.rollout.wake_up(["weights"])
        self.rollout.load_weights(self.sync.iter_weights(), kernel_format=self.sync.kernel_format)
        self.rollout.sleep()
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
        values = self.critic.compute_values(batch.input_ids, attention_mask(batch))
        return batch.gather_response(values)

    # -- updates ----------------------------------------------------------------------------
    def update_actor(self, batch: RLBatch) -> dict[str, float]:
        cfg = self.cfg.actor
        batch.require("old_log_probs", "advantages")
        fields = ["old_log_probs", "advantages"] + (["ref_log_probs"] if cfg.use_kl_loss else [])
        return self._update(self.actor, batch, fields, cfg.ppo_epochs, "actor",
                            lambda g, s, t: actor_loss(cfg, g, s, t), with_entropy=cfg.entropy_coeff != 0)

    def update_critic(self, batch: RLBatch) -> dict[str, float]:
        batch.require("values", "returns")
        cfg = self.cfg.critic
        return self._update(self.critic, batch, ["values", "returns"], cfg.ppo_epochs, "critic",
                            lambda g, s, t: critic_loss(cfg, g, s, t))

    def _update(self, engine, batch: RLBatch, fields, epochs: int, prefix: str, make_loss, with_entropy=False):
        mini = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.sampling.n
        sums: dict[str, float] = {}
        count = 0
        for _ in range(epochs):
            for part in batch.chunks(mini):
                inputs = {"input_ids": part.input_ids, "attention_mask": attention_mask(part),
                          "response_mask": to_positions(part, part.response_mask)}
                inputs.update({f: to_positions(part, getattr(part, f)) for f in fields})
                global_tokens = float(part.response_mask.sum().clamp(min=1))
                global_seqs = float((part.response_lengths > 0).sum().clamp(min=1))
                loss_fn = make_loss(global_tokens, global_seqs, part.responses.shape[1])
                kwargs = {"temperature": self._temperature(), "with_entropy": with_entropy} if prefix == "actor" else {}
                m = engine.train_step(inputs, loss_fn, **kwargs)
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {f"{prefix}/{k}": v / max(count, 1) for k, v in sums.items()}

    # -- state ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        self.actor.save_checkpoint(os.path.join(directory, "actor"))
        if self.critic is not None:
            self.critic.save_checkpoint(os.path.join(directory, "critic"))

    def load_checkpoint(self, directory: str) -> None:
        self.actor.load_checkpoint(os.path.join(directory, "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(os.path.join(directory, "critic"))

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

    # -- helpers ----------------------------------------------------------------------------
    def _temperature(self) -> float:
        t = self.cfg.rollout.sampling.temperature
        return t if t > 0 else 1.0

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
