"""verl_mp: Megatron-core model-parallel RL post-training for large language models.

Importing this package has no side effects on torch or megatron-core; the CPU
compatibility shims in `verl_mp.patches` are applied by the engine, and only on
machines without CUDA.
"""

__version__ = "0.1.0"
