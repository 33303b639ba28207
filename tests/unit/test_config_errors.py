"""Every configuration mistake comes out at once, within seconds, before any warm start,
download or process (issues 42 and 44): typos get the closest valid key, keys that do nothing
are refused, and every data source needs a reward function before anything starts."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_mp.cli import main as cli_main
from verl_mp.config.keys import REMOVED_KEYS, closest_key, schema_keys
from verl_mp.config.loader import load_config, load_config_checked, to_yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _errors(capsys, args):
    rc = cli_main(["train", *args])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    return err


def test_every_mistake_is_listed_at_once(inputs, nothing_starts, capsys):
    err = _errors(capsys, ["--config-name", "grpo", *inputs, "actor.optim.lrr=1", "trainer.total_steps=abc",
                           "algorithm.adv_estimator=foo", "actor.policy_loss=ppoo", "reward.default_fn=nope",
                           "ref.optim.lr=1e-3", "actor.ppo_mini_batch_size=3"])
    assert "7 errors in the configuration:" in err, err
    for expected in ("unknown config key: actor.optim.lrr; did you mean actor.optim.lr?",
                     "invalid value for trainer.total_steps", "algorithm.adv_estimator='foo'",
                     "unknown policy loss 'ppoo'; did you mean 'ppo'?", "unknown reward function 'nope'",
                     "ref.optim.lr does nothing", "must be a multiple of actor.ppo_mini_batch_size=3"):
        assert expected in err, (expected, err)


def test_a_preset_without_a_model_lists_the_other_mistakes_too(nothing_starts, capsys):
    err = _errors(capsys, ["--config-name", "grpo", "algorithm.adv_estimator=foo"])
    assert "algorithm.adv_estimator='foo'" in err and "model.path is empty: --config-name grpo" in err, err


@pytest.mark.parametrize("typo,meant", [("actor.optim.lrr", "actor.optim.lr"), ("actr.optim.lr", "actor.optim.lr"),
                                        ("trainer.total_step", "trainer.total_steps"),
                                        ("rollout.sampling.temprature", "rollout.sampling.temperature")])
def test_a_typo_suggests_the_closest_key(typo, meant):
    assert closest_key(typo) == meant
    _, errors = load_config_checked("grpo", [f"{typo}=1"])
    assert errors == [f"unknown config key: {typo}; did you mean {meant}? (`verl-mp config show` lists every key)"]


def test_keys_that_did_nothing_are_removed_refused_when_set_and_tolerated_in_an_old_saved_config(tmp_path):
    _, errors = load_config_checked("grpo", ["ref.optim.lr=1e-3", "ref.offload.grads=true", "ref.recompute=full",
                                             "ref.offload.params=false", "ref.micro_batch_size=2"])
    assert [e.split(" does nothing")[0] for e in errors] == ["ref.optim.lr", "ref.offload.grads", "ref.recompute"]
    assert all("the reference policy is frozen" in e for e in errors)
    assert len(REMOVED_KEYS) == 6  # 11 optimizer keys + 2 offload + 3 recompute = 16 keys
    assert not [k for k in schema_keys() if any(k == r or k.startswith(r + ".") for r in REMOVED_KEYS)]
    saved = tmp_path / "config.yaml"  # what a run writes and every rank loads
    text = to_yaml(load_config("grpo", ["ref.offload.params=false"]))
    ref = text.split("\nref:")[1].split("\ncritic:")[0]
    assert "optim:" not in ref and "recompute" not in ref and "grads" not in ref
    saved.write_text(text)
    assert load_config(str(saved)).ref.offload.params is False
    # a config.yaml saved before the keys were removed holds them at their defaults: it loads
    head, rest = text.split("\nref:\n", 1)
    ref, tail = rest.split("\ncritic:", 1)
    ref = ("  optim:\n    lr: 1.0e-06\n    weight_decay: 0.01\n  recompute: none\n  recompute_modules:\n  - mlp\n"
           "  recompute_num_layers: 1\n" + ref + "\n    grads: false\n    optimizer: false")
    old = f"{head}\nref:\n{ref}\ncritic:{tail}"
    saved.write_text(old)
    cfg, errors = load_config_checked(str(saved))
    assert errors == [] and cfg.ref.offload.params is False


def _source_data(tmp_path, source):
    row = {"prompt": [{"role": "user", "content": "What is 1+1?"}], "data_source": source,
           "reward_model": {"ground_truth": "2", "style": "rule"}}
    path = tmp_path / f"{source.replace('/', '_')}.parquet"
    pq.write_table(pa.Table.from_pylist([row] * 8), path)
    return path


def test_a_data_source_without_a_reward_function_is_refused_in_preflight(inputs, nothing_starts, capsys, tmp_path):
    data = _source_data(tmp_path, "mystery")
    out = tmp_path / "run"
    args = [a for a in inputs if not a.startswith(("data.train_files=", "trainer.default_local_dir="))]
    err = _errors(capsys, ["--config-name", "grpo", *args, f"data.train_files=[{data}]",
                           f"trainer.default_local_dir={out}", "rollout.backend=hf"])
    assert "no reward function for data_source 'mystery' (in data.train_files): map it with " \
           "reward.fn_by_source.mystery=NAME" in err, err
    assert not out.exists()  # refused before the run directory is made
    from verl_mp.trainer.setup import preflight

    cfg = load_config("grpo", [*args, f"data.train_files=[{data}]", f"trainer.default_local_dir={out}",
                               "reward.fn_by_source.mystery=arith_exact"])  # the form the message shows
    assert cfg.reward.fn_by_source == {"mystery": "arith_exact"}
    preflight(cfg)


def test_the_demo_refuses_a_mistake_in_seconds_without_its_warm_start(tmp_path):
    """The real command line, as a user types it: no warm start, no run directory, no process left."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERL_MP_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "out"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "train", "--config-name", "tiny_cpu",
                           "algorithm.adv_estimator=foo", "trainer.total_step=3", f"trainer.default_local_dir={out}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    seconds = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "2 errors in the configuration" in proc.stderr and "did you mean trainer.total_steps?" in proc.stderr
    assert "algorithm.adv_estimator='foo'" in proc.stderr
    print(f"refused in {seconds:.1f} s")
    assert seconds < 30, seconds  # ~6 s on the shared 2-core machine (Python + torch imports); a warm start is minutes
    assert not out.exists() and not (tmp_path / "cache").exists() and not (tmp_path / "outputs").exists()
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(tmp_path) in _cmdline(p)]
    assert not leftovers


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
