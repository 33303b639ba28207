"""The bad-input sweep: every mistake a user can make in config, data, model or resume
folder stops `verl-mp train` before any process starts, with exit code 2 and one line that
names the culprit and the fix, and no traceback. The table in docs/troubleshooting.md
lists these cases; rewards, numerics and a full disk are at the end of this file.
"""

import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl_mp.cli import main as cli_main

pytestmark = pytest.mark.unit

# (case, preset, overrides, message)
CONFIG_CASES = [
    ("unknown key", "grpo", ["actor.optim.lrr=1"], r"unknown config key: actor.optim.lrr; did you mean actor.optim.lr\?"),
    ("wrong type", "grpo", ["trainer.total_steps=abc"], r"invalid value for trainer.total_steps: .*expected int \(default 20; e.g. trainer.total_steps=20\)"),
    ("not a bool", "grpo", ["actor.megatron.sequence_parallel=maybe"], r"actor.megatron.sequence_parallel: .*expected bool"),
    ("override without =", "grpo", ["total_steps"], r"override 'total_steps' must look like key=value"),
    ("unknown preset", "nope", [], r"--config-name='nope': no such preset; valid presets: .*grpo"),
    ("TP not dividing heads", "grpo", ["actor.megatron.tensor_model_parallel_size=3"], r"tensor_model_parallel_size=3"),
    ("rollout TP not dividing ranks", "grpo", ["rollout.tensor_model_parallel_size=4"], r"rollout.tensor_model_parallel_size=4 must divide"),
    ("mini-batch not dividing batch", "grpo", ["actor.ppo_mini_batch_size=3"], r"data.train_batch_size=8 must be a multiple of actor.ppo_mini_batch_size=3"),
    ("unknown estimator", "grpo", ["algorithm.adv_estimator=foo"], r"algorithm.adv_estimator='foo': unknown advantage estimator 'foo'; valid names: .*gae.*grpo"),
    ("unknown policy loss", "grpo", ["actor.policy_loss=bar"], r"actor.policy_loss='bar': unknown policy loss 'bar'; valid names: .*ppo"),
    ("plugin not importable", "grpo", ["algorithm.adv_estimator=no_such_pkg.mod:fn"], r"algorithm.adv_estimator='no_such_pkg.mod:fn': cannot import module 'no_such_pkg.mod'"),
    ("unknown KL estimator", "grpo", ["actor.kl_loss_type=k9"], r"actor.kl_loss_type='k9': unknown KL estimator"),
    ("unknown launcher", "grpo", ["trainer.launcher=mpi"], r"trainer.launcher='mpi' is not one of"),
    ("more ranks than the machine", "grpo", ["trainer.nproc=64"], r"trainer.nproc=64 asks for more ranks"),
    ("bad sleep level", "grpo", ["rollout.sleep_level=3"], r"rollout.sleep_level=3 must be 1 \(offload the weights"),
    ("negative CUDA-graph range", "grpo", ["rollout.cudagraph_max_tokens=-16"],
     r"rollout.cudagraph_max_tokens=-16 must be >= 0 \(0: vLLM.s own capture sizes; null: the planner.s choice\)"),
    ("unknown sync mode", "grpo", ["rollout.weight_sync_mode=fast"], r"rollout.weight_sync_mode='fast' is not one of \('auto', 'gather', 'local'\)"),
    ("local sync without vLLM", "grpo", ["rollout.backend=hf", "rollout.weight_sync_mode=local"], r"weight_sync_mode=local needs rollout.backend=vllm"),
    ("fp16 training", "grpo", ["model.dtype=fp16"], r"model.dtype='fp16' is not one of \('fp32', 'bf16'\) \(fp16 training overflows"),
    ("unknown recompute mode", "grpo", ["actor.recompute=some"], r"actor.recompute='some' is not one of \('none', 'selective', 'full'\)"),
    ("packing with unfused attention", "grpo", ["critic.remove_padding=true", "critic.attention_backend=local"], r"critic.remove_padding=true needs critic.attention_backend"),
    ("validation too long for the model length", "grpo", ["rollout.val_sampling.max_new_tokens=100"], r"data.max_prompt_length=64 \+ rollout.val_sampling.max_new_tokens=100 = 164 exceeds rollout.max_model_len=128"),
    ("model length above the model's", "grpo", ["rollout.max_model_len=100000"], r"rollout.max_model_len=100000 exceeds the model's max_position_embeddings"),
    ("unknown reward function", "grpo", ["reward.default_fn=nope"], r"unknown reward function 'nope'; valid names: .*gsm8k"),
    ("seed scope", "grpo", ["rollout.sampling.seed_scope=prompt"], r"rollout.sampling.seed_scope='prompt' is not one of \('batch', 'request'\)"),
]


def _run(capsys, preset, args):
    rc = cli_main(["train", "--config-name", preset, *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


@pytest.mark.parametrize("case,preset,overrides,message", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_mistakes(inputs, nothing_starts, capsys, case, preset, overrides, message):
    rc, err = _run(capsys, preset, [*inputs, *overrides])
    assert rc == 2 and re.search(message, err), err


def test_a_single_file_is_accepted_where_a_list_is_expected(inputs):
    from verl_mp.config.loader import load_config

    train = next(a for a in inputs if a.startswith("data.train_files=")).split("=", 1)[1].strip("[]")
    assert load_config("grpo", [f"data.train_files={train}"]).data.train_files == [train]


# -- data ------------------------------------------------------------------------------------------
def _with(inputs, key, value):
    return [a for a in inputs if not a.startswith(f"{key}=")] + [f"{key}={value}"]


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


GOOD_ROW = {"prompt": [{"role": "user", "content": "What is 1+1?"}], "data_source": "synthetic_arith",
            "reward_model": {"ground_truth": "2", "style": "rule"}}


@pytest.mark.parametrize("case,make,message", [
    ("missing file", lambda d: d / "nope.parquet", r"data.train_files: .*nope.parquet does not exist"),
    ("json lines, not parquet", lambda d: (d / "t.jsonl").write_text('{"prompt": "x"}\n') and d / "t.jsonl",
     r"data.train_files: .*t.jsonl is not a parquet file .*docs/data.md"),
    ("no rows", lambda d: _parquet(d / "empty.parquet", []) if False else _empty(d),
     r"data.train_files: no usable prompts in .*0 rows read"),
    ("missing column", lambda d: _parquet(d / "c.parquet", [{k: v for k, v in GOOD_ROW.items() if k != "data_source"}]),
     r"c.parquet.*data_source"),
    ("empty prompt in a row", lambda d: _parquet(d / "r.parquet", [GOOD_ROW, {**GOOD_ROW, "prompt": []}]),
     r"r.parquet.*row 1"),
    ("every prompt too long", lambda d: _parquet(d / "l.parquet", [{**GOOD_ROW, "prompt": [
        {"role": "user", "content": "What is 1+1? " * 60}]}]), r"no usable prompts .*1 longer than data.max_prompt_length=64"),
])
def test_data_mistakes(inputs, nothing_starts, capsys, tmp_path, case, make, message):
    rc, err = _run(capsys, "grpo", _with(inputs, "data.train_files", f"[{make(tmp_path)}]"))
    assert rc == 2 and re.search(message, err), err


def _empty(d):
    table = pa.Table.from_pylist([GOOD_ROW]).slice(0, 0)
    pq.write_table(table, d / "empty.parquet")
    return d / "empty.parquet"


def test_bad_validation_file_is_named_as_such(inputs, nothing_starts, capsys, tmp_path):
    rc, err = _run(capsys, "grpo", [*inputs, f"data.val_files=[{tmp_path / 'v.parquet'}]"])
    assert rc == 2 and "data.val_files: " in err and "v.parquet does not exist" in err, err


# -- models ----------------------------------------------------------------------------------------
def _model_copy(inputs, tmp_path, edit=None, drop=()):
    src = next(a for a in inputs if a.startswith("model.path=")).split("=", 1)[1]
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    if edit:
        config = json.loads((dst / "config.json").read_text())
        edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("case,edit,drop,message", [
    ("not an HF directory", None, ("config.json",), r"model.path=.* is not an HF checkpoint directory \(no config.json\)"),
    ("unsupported architecture", lambda c: c.update(architectures=["GPT2LMHeadModel"]), (),
     r"config.json.*GPT2LMHeadModel"),
    ("tokenizer larger than the vocabulary", lambda c: c.update(vocab_size=64), (),
     r"the tokenizer has \d+ tokens but config.json vocab_size=64"),
    ("no tokenizer", None, ("tokenizer.json", "tokenizer_config.json"), r"model.path=.*: no usable tokenizer"),
])
def test_model_mistakes(inputs, nothing_starts, capsys, tmp_path, case, edit, drop, message):
    model = _model_copy(inputs, tmp_path, edit, drop)
    rc, err = _run(capsys, "grpo", _with(inputs, "model.path", model))
    assert rc == 2 and re.search(message, err), err


# -- the embedded demo -----------------------------------------------------------------------------
def test_demo_never_replaces_the_users_data(nothing_starts, capsys, tmp_path):
    rc, err = _run(capsys, "tiny_cpu", [f"data.train_files=[{tmp_path / 'mine.parquet'}]"])
    assert rc == 2 and "the embedded demo never replaces your data" in err and "model.path=HF_DIR" in err


def test_a_real_preset_without_a_model_says_so(nothing_starts, capsys):
    rc, err = _run(capsys, "grpo", [])
    assert rc == 2 and "model.path is empty: --config-name grpo needs model.path=HF_DIR" in err


# -- resume folders --------------------------------------------------------------------------------
def test_explicit_resume_path_that_is_no_checkpoint(inputs, nothing_starts, capsys, tmp_path):
    rc, err = _run(capsys, "grpo", [*inputs, f"trainer.resume_mode={tmp_path}"])
    assert rc == 2 and "trainer.resume_mode" in err, err


# -- numerics --------------------------------------------------------------------------------------
def test_nan_rewards_stop_at_the_advantages():
    from verl_mp.config.schema import AlgorithmConfig
    from verl_mp.data.rl_batch import RLBatch
    from verl_mp.trainer.steps import compute_advantages

    batch = RLBatch.from_samples([[1, 2]], [[3, 4], [5]], 2, 0, ["x"], ["s"])
    batch.token_level_rewards = torch.tensor([[1.0, float("nan")], [0.0, 0.0]])
    with pytest.raises(FloatingPointError, match=r"non-finite \['advantages', 'returns'\] in the advantages phase"):
        compute_advantages(batch, AlgorithmConfig(adv_estimator="grpo"))


def test_nan_loss_stops_the_run():
    from verl_mp.trainer.steps import check_finite

    check_finite({"actor/pg_loss": 0.5}, "update")
    with pytest.raises(FloatingPointError, match=r"non-finite \['actor/grad_norm'\] in the update phase.*bf16"):
        check_finite({"actor/pg_loss": 0.5, "actor/grad_norm": float("inf")}, "update")


# -- a full disk during a checkpoint ------------------------------------------------------------
DISK_FULL = r'''
import resource, signal, sys
from tests.unit.test_trainer_resume_check import make_cfg, make_model, trainer

class Workers:
    size = 10
    def describe(self):
        return {"actor_rollout_ref": {"flop_params": 1, "world_size": 1}}
    def save_checkpoint(self, directory):
        with open(f"{directory}/actor.bin", "wb") as f:
            f.write(b"w" * self.size)

tmp = __import__("pathlib").Path(sys.argv[1])
t = trainer(make_cfg(tmp, make_model(tmp / "model")))
t.workers = Workers()
t.save(1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
t.workers.size = 1 << 20
try:
    t.save(2)
except OSError as err:
    print(err)
'''


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = tmp_path / "out" / "checkpoints"
    assert "the checkpoint of step 2 could not be written" in proc.stdout, proc.stdout
    assert f"the last complete checkpoint, {ckpts / 'global_step_1'}, is intact" in proc.stdout
    assert "trainer.resume_mode=auto" in proc.stdout
    assert (ckpts / "global_step_1" / "meta.json").exists() and not (ckpts / "global_step_2").exists()
    assert (ckpts / "global_step_1" / "actor.bin").read_bytes() == b"w" * 10


def test_a_run_that_cannot_fit_its_gpus_is_refused_with_fixes(inputs, nothing_starts, capsys, tmp_path):
    """Issue 21's shape (Qwen2-1.5B body, micro-batch 16, 1152-token sequences) on 24 GiB GPUs."""
    from tests.unit.planner_models import write_config
    from verl_mp.demo.tokenizer import save_tiny_tokenizer

    model = write_config(tmp_path, "Qwen2-1.5B")
    save_tiny_tokenizer(model)
    rc, err = _run(capsys, "grpo", _with(inputs, "model.path", model) + [
        "trainer.gpu_memory_gib=24", "actor.micro_batch_size=16", "rollout.max_model_len=1152",
        "rollout.sampling.max_new_tokens=1024", "rollout.val_sampling.max_new_tokens=64"])
    assert rc == 2 and "the run does not fit GPUs of 24" in err and "Fixes: [" in err, err
    assert "set trainer.gpu_memory_gib to plan for other GPUs" in err
