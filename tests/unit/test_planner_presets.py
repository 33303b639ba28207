"""Every real-model preset in megatron_configs/ fits the GPUs its header names, with the
memory the header states, and passes the trainer's preflight.

Each such preset starts with ``# <model> (...), <algorithm>, <N> GPUs of <80|141> GB`` and
names its expected peak (``peak X GiB per GPU in <phase>``); the model's config.json is
written from its published hyperparameters (tests/unit/planner_models.py).
"""

import re

import pytest
from planner_models import MODEL_CONFIGS, write_config

from verl_mp.config.loader import PRESET_DIR, load_config
from verl_mp.config.placement import resolve_placement
from verl_mp.plan import enabled_roles
from verl_mp.planner import MemoryPlanOptions, plan_memory
from verl_mp.planner.cli import read_spec
from verl_mp.planner.memory_plan import GIB

pytestmark = pytest.mark.unit

GPU_GIB = {"80": 79.6, "141": 140.4}  # what the driver reports for an H100 80GB / an H200
HEADER = re.compile(r"^# (\S+) \(.*\), .+?, (\d+) GPUs of (80|141) GB")
PEAK = re.compile(r"peak ([\d.]+) GiB per GPU in (\S+)")


def real_model_presets():
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if HEADER.match(p.read_text()))


def header(name):
    text = (PRESET_DIR / f"{name}.yaml").read_text()
    model, gpus, gb = HEADER.match(text).groups()
    peak, phases = PEAK.search(text).groups()
    return model, int(gpus), GPU_GIB[gb], float(peak), phases.split("/")


def test_the_issue_presets_exist():
    assert {"qwen2_5_7b_grpo_8gpu", "qwen3_32b_grpo_16gpu", "llama3_1_70b_grpo_32gpu",
            "qwen2_5_7b_ppo_critic_pool_16gpu"} <= set(real_model_presets())


@pytest.mark.parametrize("name", real_model_presets())
def test_preset_fits_as_labelled(name, tmp_path):
    model, gpus, gpu_gib, peak_gib, peak_phases = header(name)
    assert model in MODEL_CONFIGS, f"{name}: add {model}'s config.json to tests/unit/planner_models.py"
    cfg = load_config(name, [f"model.path={write_config(tmp_path, model)}"])
    assert resolve_placement(cfg.trainer, enabled_roles(cfg)).num_ranks == gpus, "the header's GPU count must be the preset's ranks"
    result = plan_memory(cfg, read_spec(cfg.model.path), MemoryPlanOptions(gpu_memory_gib=gpu_gib))
    print(name, f"peak {result.peak.total / GIB:.1f} GiB ({result.peak.name})")
    assert result.fits, result.problems
    assert result.peak.total / GIB == pytest.approx(peak_gib, abs=0.05), "update the header's expected peak"
    assert result.peak.name in peak_phases


@pytest.mark.parametrize("name", real_model_presets())
def test_preset_passes_preflight(name, tmp_path, monkeypatch):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tokenizer import save_tiny_tokenizer
    from verl_mp.trainer.setup import preflight

    model = header(name)[0]
    train, _ = write_synthetic_dataset(tmp_path / "data", num_train=16, num_test=4)  # preflight reads the data
    model_dir = write_config(tmp_path, model)
    save_tiny_tokenizer(model_dir)  # and tokenizes it (a small vocabulary fits any model's)
    monkeypatch.setenv("VERL_MP_MAX_CPU_RANKS", "64")  # the presets name GPU ranks, not CPU ones
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # multi-node pools need a Ray cluster, not a local one
    cfg = load_config(name, [f"model.path={model_dir}", f"data.train_files=[{train}]"])
    preflight(cfg)


def test_readme_lists_every_preset():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in real_model_presets():
        assert f"`{name}`" in readme, name
