"""Rewards: rule functions and their registry, the safe per-sample runner, reward models.

- ``registry``: ``REWARD_FUNCTIONS``, ``register_reward``, ``get_reward_fn`` (names and
  ``module:function`` plugins), ``DEFAULT_FN_BY_SOURCE``.
- ``rules``: ``gsm8k``, ``math_boxed``, ``arith_exact``, ``format``.
- ``executor``: runs calls in worker processes with exception capture and timeouts.
- ``manager``: ``RewardManager`` (scores + ``reward/`` metrics) and ``token_level_rewards``.
- ``reward_model``: ``SequenceScorer`` over a HF sequence classifier.

Nothing is imported here on purpose: reward worker processes import only what they run
(no torch).
"""
