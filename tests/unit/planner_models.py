"""config.json of the real models the presets are for (`verl_mp.planner.known_models`),
written into a temp dir by the planner tests; no download."""

import json
from pathlib import Path

from verl_mp.planner.known_models import MODEL_CONFIGS

PUBLISHED_PARAMS = {  # the parameter counts the model cards state
    "Qwen2-1.5B": 1.54e9, "Qwen2.5-7B": 7.61e9, "Qwen3-32B": 32.8e9, "Llama-3.1-70B": 70.6e9,
    "Qwen3-30B-A3B": 30.5e9, "Qwen3-235B-A22B": 235e9, "DeepSeek-V3": 671e9, "Kimi-K2": 1.03e12,
}


def write_config(root: Path, name: str) -> Path:
    """``root/name/config.json``; returns the directory (a model.path for the planner)."""
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIGS[name]))
    return path
