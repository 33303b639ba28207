"""CriticWorker: the value model on this rank's shard, its forward pass and its update.

Hosted two ways, same code: inside `HybridWorker` (colocated: the critic shares the
actor's processes and parallel layout) or alone in a Ray worker group on its own pool
(split placement: its own torch.distributed world and ``critic.megatron`` layout). Every
method is collective over the processes that host it.
"""

from __future__ import annotations

import os

import torch

from verl_mp.config.schema import RootConfig, critic_layout
from verl_mp.data.rl_batch import RLBatch, attention_mask
from verl_mp.engine.engine import MegatronEngine
from verl_mp.workers.engine_role import engine_config, mini_batch_rows, train_epochs
from verl_mp.workers.losses import critic_loss


class CriticWorker:
    def __init__(self, cfg: RootConfig):
        self.cfg = cfg
        self.engine = MegatronEngine(engine_config(cfg, "critic", critic_layout(cfg)))
        self.engine.load_hf()

    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        """[B, T] value estimates at the response tokens (0 on padding)."""
        values = self.engine.compute_values(batch.input_ids, attention_mask(batch))
        return batch.gather_response(values)

    def update_critic(self, batch: RLBatch) -> dict[str, float]:
        batch.require("values", "returns")
        cfg = self.cfg.critic
        return train_epochs(self.engine, batch, ["values", "returns"], epochs=cfg.ppo_epochs,
                            mini_batch_size=mini_batch_rows(self.cfg), prefix="critic",
                            make_loss=lambda g, s, t: critic_loss(cfg, g, s, t))

    def save_checkpoint(self, directory: str) -> None:
        """Writes ``directory/critic`` (the same place whether colocated or split)."""
        self.engine.save_checkpoint(os.path.join(directory, "critic"))

    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_checkpoint(os.path.join(directory, "critic"))

    def close(self) -> None:
        """Nothing outlives this worker's process."""
