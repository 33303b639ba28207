"""Per-architecture HF <-> megatron name/layout maps and layer specs (see docs/engine.md).

Public interface:

- `ARCHITECTURES` / `get_architecture(name)`: the registry keyed by HF ``architectures[0]``.
- `spec_from_hf_config(hf_config) -> GPTSpec`.
- `megatron_to_hf(spec, megatron_name, full_tensor) -> [(hf_name, tensor)]` and its inverse
  `hf_to_megatron(spec, megatron_name, {hf_name: tensor}) -> tensor` (pure, per tensor).
"""

from verl_mp.models.convert import hf_names, hf_to_megatron, megatron_global_names, megatron_to_hf
from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.models.registry import ARCHITECTURES, get_architecture, register_architecture
from verl_mp.models.spec import GPTSpec

__all__ = [
    "ARCHITECTURES", "GPTSpec", "get_architecture", "hf_names", "hf_to_megatron", "megatron_global_names",
    "megatron_to_hf", "register_architecture", "spec_from_hf_config",
]
