"""`verl-mp plan` without a checkpoint (issue 44): a real-model preset plans its model's
built-in shape and says where it comes from; a preset without one names the HF file to fetch;
a CPU demo gets no GPU numbers unless asked."""

import pytest
from planner_models import write_config

from verl_mp.cli import main as cli_main
from verl_mp.planner.known_models import HF_REPOS, MODEL_CONFIGS, preset_model

pytestmark = pytest.mark.unit


def _plan(capsys, *args):
    rc = cli_main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_real_model_preset_plans_its_models_shape_without_a_checkpoint(capsys, tmp_path):
    assert preset_model("qwen2_5_7b_grpo_8gpu") == "Qwen2.5-7B" and set(MODEL_CONFIGS) == set(HF_REPOS)
    rc, built_in, _ = _plan(capsys, "--config-name", "qwen2_5_7b_grpo_8gpu", "--gpu-memory-gib", "79.6")
    assert rc == 0
    assert "shape from Qwen2.5-7B's published config.json (built in: " \
           "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json)" in built_in
    model = write_config(tmp_path, "Qwen2.5-7B")
    rc, from_file, _ = _plan(capsys, "--config-name", "qwen2_5_7b_grpo_8gpu", f"model.path={model}",
                             "--gpu-memory-gib", "79.6")
    assert rc == 0 and f"shape from {model}/config.json" in from_file
    assert built_in.splitlines()[1:] == from_file.splitlines()[1:]  # the same plan


def test_a_preset_without_a_model_names_the_hf_file(capsys):
    rc, _, err = _plan(capsys, "--config-name", "grpo")
    assert rc == 2 and "the config.json of the model's HF repository, e.g. https://huggingface.co/" in err, err


def test_a_cpu_demo_gets_no_gpu_numbers(capsys):
    rc, out, _ = _plan(capsys, "--config-name", "tiny_cpu")
    assert rc == 0 and "a CPU run (2 gloo ranks" in out and "no GPU memory to plan" in out, out
    assert "GPUs of" not in out and "peak" not in out
    rc, out, _ = _plan(capsys, "--config-name", "tiny_cpu", "--gpu-memory-gib", "80")
    assert rc == 0 and "2 GPUs of 80.0 GiB" in out  # asked for
