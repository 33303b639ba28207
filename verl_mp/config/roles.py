"""The names of roles and worker groups, defined once (docs/architecture.md, glossary).

- a **role** is a model or engine a process can host (`ROLES`); three of them are Megatron
  engines (`ENGINE_ROLES`).
- a **group** is the processes that host the same roles and share one torch.distributed world
  (`GROUPS`), named by its placement key. ``trainer.placement.roles.<group>`` is keyed by these
  group names although the key says ``roles`` (renaming it would break every saved config and
  preset): ``actor_rollout_ref`` always hosts the actor and its reference, and the rollout, the
  critic and the reward model unless they are placed on a pool of their own.
"""

ROLES = ("actor", "ref", "rollout", "critic", "reward_model")
"""What a process can host. The actor and its reference always share the
``actor_rollout_ref`` group; the rollout, the critic and the reward model join it unless
placed apart (a rollout group hosts vLLM alone)."""

ENGINE_ROLES = ("actor", "ref", "critic")
"""The roles that are Megatron engines (`verl_mp.engine.config.EngineConfig.role`)."""

GROUPS = ("actor_rollout_ref", "critic", "reward_model", "rollout")
"""Worker groups, named by their placement key (``trainer.placement.roles.<group>``)."""
