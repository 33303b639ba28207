"""RoleRouter: the driver's one handle on the worker groups, sending each call to the
group that hosts its role.

Without split placement every role lives in the actor_rollout_ref group and the router
only forwards. A critic on its own pool answers ``compute_values``/``update_critic``
and writes its part of every checkpoint; a reward model on its own pool answers
``score_sequences`` (its ranks score shares of the texts). The groups can be Ray worker
groups or any objects with the same methods (tests use plain ones).
"""

from __future__ import annotations

import torch


class RoleRouter:
    def __init__(self, actor_rollout_ref, *, critic=None, reward_model=None):
        self.actor_rollout_ref = actor_rollout_ref
        self.critic = critic
        """The critic's own group, or None when the critic (if any) is colocated."""
        self.reward_model = reward_model
        """The reward model's own group, or None when it (if any) is colocated."""

    # -- actor, reference, rollout ------------------------------------------------------------
    def generate(self, prompt_ids, sampling):
        return self.actor_rollout_ref.generate(prompt_ids, sampling)

    def sync_weights(self) -> dict[str, float]:
        return self.actor_rollout_ref.sync_weights()

    def compute_log_probs(self, batch, role: str) -> torch.Tensor:
        return self.actor_rollout_ref.compute_log_probs(batch, role)

    def update_actor(self, batch) -> dict[str, float]:
        return self.actor_rollout_ref.update_actor(batch)

    def export_hf(self, directory: str) -> None:
        self.actor_rollout_ref.export_hf(directory)

    # -- critic, reward model -----------------------------------------------------------------
    def compute_values(self, batch) -> torch.Tensor:
        return (self.critic or self.actor_rollout_ref).compute_values(batch)

    def update_critic(self, batch) -> dict[str, float]:
        return (self.critic or self.actor_rollout_ref).update_critic(batch)

    def score_sequences(self, texts: list[str]) -> torch.Tensor:
        if self.reward_model is None:
            return self.actor_rollout_ref.score_sequences(texts)
        return torch.cat(self.reward_model.scatter("score", texts))

    # -- run state ----------------------------------------------------------------------------
    def model_info(self) -> dict[str, int]:
        """The actor's FLOP parameter count; world_size counts every training device
        (a split critic's too; its passes are in the step's FLOP estimate)."""
        info = dict(self.actor_rollout_ref.model_info())
        if self.critic is not None:
            info["world_size"] += self.critic.world_size
        return info

    def save_checkpoint(self, directory: str) -> None:
        for group in self._training_groups():
            group.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        for group in self._training_groups():
            group.load_checkpoint(directory)

    def shutdown(self) -> None:
        for group in (self.actor_rollout_ref, self.critic, self.reward_model):
            if group is not None:
                group.shutdown()

    def _training_groups(self) -> list:
        return [g for g in (self.actor_rollout_ref, self.critic) if g is not None]
