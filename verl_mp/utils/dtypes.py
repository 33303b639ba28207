"""The dtype names used in configs and what each engine accepts.

One place for every dtype name: ``fp32``, ``bf16`` and ``fp16`` map to torch and vLLM
dtypes; training (the Megatron engines, hence the rollout that must match them) takes
fp32 or bf16 only. fp16 training is refused on purpose: without loss scaling its range
overflows in RL (the classic NaN-advantage failure), and bf16 has fp32's range.
"""

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
TRAIN_DTYPES = ("fp32", "bf16")
"""What the Megatron engines (actor, reference, critic) and the trainer's rollout take."""
INFERENCE_DTYPES = tuple(TORCH_DTYPES)
"""What forward-only models take (reward models, stand-alone rollout benchmarks)."""


def check_dtype(setting: str, value: str, allowed: tuple[str, ...]) -> None:
    """ValueError naming ``setting`` when ``value`` is not in ``allowed``."""
    if value in allowed:
        return
    why = " (fp16 training overflows without loss scaling; bf16 has fp32's range)" if value == "fp16" else ""
    raise ValueError(f"{setting}={value!r} is not one of {allowed}{why}; e.g. {setting}=bf16")
