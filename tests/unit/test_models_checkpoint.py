"""Bad checkpoints and layouts fail up front with errors naming the file or setting.

Also the CLI exit codes: preflight errors exit 2 before any rank starts; ``verify`` exits 1
above its tolerance.
"""

import json
import re
import shutil

import pytest
import torch

from verl_mp.cli import engine as cli_engine
from verl_mp.cli import main as cli_main
from verl_mp.demo.tiny_models import build_tiny_checkpoint
from verl_mp.models.convert import SliceRead
from verl_mp.models.hf_checkpoint import SliceReader, open_hf_checkpoint

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_checkpoint("qwen2", tmp_path_factory.mktemp("qwen2") / "model", shard_kb=20)


@pytest.fixture
def copy(tiny, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny, dst)
    return dst


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_valid_checkpoint_and_slice_reads(tiny):
    ckpt = open_hf_checkpoint(tiny)
    assert ckpt.spec.architecture == "Qwen2ForCausalLM" and len(set(ckpt.weight_map.values())) > 1
    from safetensors import safe_open

    name = "model.layers.1.mlp.down_proj.weight"
    with safe_open(str(tiny / ckpt.weight_map[name]), "pt") as f:
        full = f.get_tensor(name)
    with SliceReader(ckpt) as reader:
        assert torch.equal(reader.read(SliceRead(name, 1, 32, 64)), full[:, 32:64])
        assert torch.equal(reader.read(SliceRead(name)), full)


def test_unsupported_architecture(copy):
    edit_config(copy, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match=r"config.json: architecture 'GPT2LMHeadModel' is not supported"):
        open_hf_checkpoint(copy)


def test_missing_shard_names_the_file(copy):
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (copy / victim).unlink()
    with pytest.raises(FileNotFoundError, match=victim):
        open_hf_checkpoint(copy)


def test_shape_not_matching_config_names_file_and_tensor(copy):
    edit_config(copy, intermediate_size=96)
    with pytest.raises(ValueError, match=r"model-\d+-of-\d+\.safetensors: tensor 'model\.layers\.0\.mlp\..*' "
                                         r"has shape \[128, 64\] but config.json implies \[96, 64\]"):
        open_hf_checkpoint(copy)


def test_tensor_the_config_does_not_declare(copy):
    edit_config(copy, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.\d+\.self_attn\.[qkv]_proj\.bias'"):
        open_hf_checkpoint(copy)


def test_missing_tensor(copy):
    edit_config(copy, num_hidden_layers=5)
    with pytest.raises(ValueError, match=r"tensor 'model\.layers\.4\..*' is missing"):
        open_hf_checkpoint(copy)


@pytest.fixture
def no_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(cli_engine, "launch_local", lambda *a, **k: calls.append(a))
    return calls


@pytest.mark.parametrize("tp,pp,match", [
    (4, 1, "--tp 4 --pp 1 does not fit .*must divide the KV heads"),
    (1, 3, "--tp 1 --pp 3 does not fit .*num_layers=4 is not divisible"),
])
def test_cli_refuses_bad_layout_before_launching(tiny, no_launch, capsys, tp, pp, match):
    rc = cli_main(["verify", "--model", str(tiny), "--tp", str(tp), "--pp", str(pp)])
    assert rc == 2 and not no_launch
    assert re.search(match, capsys.readouterr().err)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return build_tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe") / "model")


@pytest.mark.parametrize("flags,match", [
    (["--ep", "3"], r"--tp 1 --pp 1 --ep 3 does not fit .*expert_model_parallel_size=3 must divide the number of experts \(4\)"),
    (["--ep", "2", "--etp", "3"], r"expert_tensor_parallel_size=3 must divide the expert intermediate size \(32\)"),
])
def test_cli_refuses_bad_expert_layout_before_launching(tiny_moe, no_launch, capsys, flags, match):
    assert cli_main(["verify", "--model", str(tiny_moe), *flags]) == 2 and not no_launch
    assert re.search(match, capsys.readouterr().err)


def test_cli_refuses_expert_parallel_for_dense_models(tiny, no_launch, capsys):
    assert cli_main(["convert", "hf-to-megatron", "--src", str(tiny), "--out", "o", "--ep", "2"]) == 2
    assert not no_launch and "expert_model_parallel_size=2 needs a mixture-of-experts" in capsys.readouterr().err


@pytest.mark.parametrize("flags,nproc", [(["--tp", "2", "--ep", "2"], 4), (["--tp", "2", "--ep", "2", "--etp", "1"], 2),
                                         (["--pp", "2", "--ep", "2"], 4), (["--ep", "4"], 4)])
def test_cli_starts_the_ranks_an_expert_layout_needs(tiny_moe, monkeypatch, capsys, flags, nproc):
    """TP x PP and expert-TP x EP x PP must both divide the world: the CLI starts their lcm."""
    calls = []

    def fake_launch(module, n, args, **kw):
        calls.append((n, args))
        with open(args[args.index("--out") + 1], "w") as f:
            json.dump({"max_abs_diff": 0.0}, f)

    monkeypatch.setattr(cli_engine, "launch_local", fake_launch)
    assert cli_main(["verify", "--model", str(tiny_moe), *flags]) == 0
    [(n, args)] = calls
    assert n == nproc and "--ep" in args
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["ep"] == int(flags[flags.index("--ep") + 1]) and line["arch"] == "Qwen3MoeForCausalLM"


def test_cli_refuses_bad_checkpoint_before_launching(copy, no_launch, capsys):
    edit_config(copy, architectures=["FalconForCausalLM"])
    assert cli_main(["convert", "hf-to-megatron", "--src", str(copy), "--out", str(copy / "o")]) == 2
    assert not no_launch and "FalconForCausalLM" in capsys.readouterr().err


@pytest.mark.parametrize("diff,tol,rc", [(5e-5, None, 0), (5e-4, None, 1), (5e-4, 1e-3, 0)])
def test_verify_exit_code_and_json_line(tiny, monkeypatch, capsys, diff, tol, rc):
    def fake_launch(module, nproc, args, **kw):
        out = args[args.index("--out") + 1]
        with open(out, "w") as f:
            json.dump({"max_abs_diff": diff}, f)

    monkeypatch.setattr(cli_engine, "launch_local", fake_launch)
    argv = ["verify", "--model", str(tiny), "--tp", "2", "--pp", "2"] + (["--tol", str(tol)] if tol else [])
    assert cli_main(argv) == rc
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == {"max_abs_diff": diff, "tol": tol or 1e-4, "passed": rc == 0, "tp": 2, "pp": 2,
                    "arch": "Qwen2ForCausalLM", "dtype": "fp32", "reference": "hf-fp32"}


@pytest.mark.parametrize("diff,hf_err,rc", [(0.06, 0.01, 1), (0.06, 0.05, 0), (0.04, 0.0, 0)])
def test_verify_bf16_tolerance_follows_hf_bf16_error(tiny, monkeypatch, capsys, diff, hf_err, rc):
    def fake_launch(module, nproc, args, **kw):
        with open(args[args.index("--out") + 1], "w") as f:
            json.dump({"max_abs_diff": diff, "hf_bf16_max_abs_diff": hf_err}, f)

    monkeypatch.setattr(cli_engine, "launch_local", fake_launch)
    assert cli_main(["verify", "--model", str(tiny), "--dtype", "bf16"]) == rc
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["tol"] == pytest.approx(max(0.05, 1.5 * hf_err)) and line["hf_bf16_max_abs_diff"] == hf_err
