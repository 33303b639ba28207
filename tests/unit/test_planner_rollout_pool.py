"""The planner with the rollout on a pool of its own (``trainer.placement.roles.rollout``):
the actor's pool without vLLM, the rollout's pool planned, preflight and `verl-mp plan`.

Expected bytes are computed here from the published Qwen2.5-7B shape
(tests/unit/planner_models.py) and the settings, not with the planner's helpers.
"""

import pytest
from planner_models import MODEL_CONFIGS, write_config

from verl_mp.cli import main as cli_main
from verl_mp.config.loader import load_config
from verl_mp.planner import MemoryPlanOptions, check_fits, plan_memory
from verl_mp.planner.cli import read_spec
from verl_mp.planner.memory_plan import GIB, RUNTIME_OVERHEAD_BYTES
from verl_mp.planner.rollout import VLLM_ASLEEP_BYTES

pytestmark = pytest.mark.unit

H100 = 79.6
PRESET = "qwen2_5_7b_grpo_8gpu"  # actor TP4+SP x DP2 on 8 GPUs, vLLM TP2, u=0.5, bf16
SPLIT = ["trainer.launcher=ray", "trainer.placement.pools.gen=[4]", "trainer.placement.roles.rollout=gen"]
BF16 = 2


def qwen7b_params() -> int:
    """Qwen2.5-7B from its config.json: untied embedding and LM head, QKV with bias, SwiGLU."""
    c = MODEL_CONFIGS["Qwen2.5-7B"]
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    layer = h * h + h + 2 * (kv * h + kv) + h * h + 3 * f * h + 2 * h
    return 2 * v * h + c["num_hidden_layers"] * layer + h


def channel_bucket(bucket_mb: int) -> int:
    """A bucket of the weight channel: the setting, or the largest tensor (the embedding)."""
    c = MODEL_CONFIGS["Qwen2.5-7B"]
    return max(bucket_mb * 2**20, c["vocab_size"] * c["hidden_size"] * BF16)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("rollout_pool"), "Qwen2.5-7B")


def planned(model, extra=(), gib=H100):
    cfg = load_config(PRESET, [f"model.path={model}", *extra])
    return cfg, plan_memory(cfg, read_spec(model), MemoryPlanOptions(gpu_memory_gib=gib))


def by_pool(result, pool):
    return {ph.name: ph for ph in result.phases if ph.pool == pool}


def test_actor_pool_loses_exactly_the_vllm_terms(model):
    cfg, colocated = planned(model)
    _, split = planned(model, SPLIT)
    assert cfg.rollout.gpu_memory_utilization == 0.5 and cfg.rollout.weight_sync_bucket_mb == 256
    col, sep = by_pool(colocated, "actor"), by_pool(split, "actor")
    assert list(sep) == ["start", "old_log_prob", "ref_log_prob", "update_actor", "sync"]  # no generate there
    budget = int(0.5 * H100 * GIB)
    weights = qwen7b_params() * BF16 // 2  # vLLM's TP2 shard, awake for the colocated sync
    send = 2 * channel_bucket(256)  # actor rank 0: one bucket on the wire, the next one filling
    expected = {"start": budget, "old_log_prob": VLLM_ASLEEP_BYTES, "ref_log_prob": VLLM_ASLEEP_BYTES,
                "update_actor": VLLM_ASLEEP_BYTES, "sync": VLLM_ASLEEP_BYTES + weights - send}
    for name, diff in expected.items():
        assert col[name].total - sep[name].total == diff, name
        assert sep[name].parts["vllm"] == 0
    assert sep["sync"].parts["work"] - col["sync"].parts["work"] == send  # both syncs gather (TP4 -> TP2)
    peak = max(sep.values(), key=lambda ph: ph.total)
    assert peak.total == max(col[n].total - d for n, d in expected.items())
    print(f"actor pool peak: colocated {colocated.peak.total / GIB:.2f} GiB ({colocated.peak.name}), "
          f"split {peak.total / GIB:.2f} GiB ({peak.name}); send buffers {send / GIB:.2f} GiB")
    assert peak.total < colocated.peak.total


def test_rollout_pool_holds_vllm_and_the_receive_buffers(model):
    _, split = planned(model, SPLIT)
    rollout = by_pool(split, "rollout")
    assert list(rollout) == ["start", "generate", "sync"]
    c = MODEL_CONFIGS["Qwen2.5-7B"]
    budget = int(0.5 * H100 * GIB)
    # 3 buckets (loading, posted, and one kept by a module split over the boundary) plus the
    # largest module vLLM rebuilds at TP2: the embedding's half of the vocabulary
    receive = 3 * channel_bucket(256) + c["vocab_size"] // 2 * c["hidden_size"] * BF16
    for name in ("start", "generate"):
        assert rollout[name].total == budget + RUNTIME_OVERHEAD_BYTES
    assert rollout["sync"].parts == {"actor": 0, "ref": 0, "critic": 0, "reward_model": 0, "vllm": budget,
                                     "work": receive, "overhead": RUNTIME_OVERHEAD_BYTES}
    assert max(rollout.values(), key=lambda ph: ph.total).total == budget + receive + RUNTIME_OVERHEAD_BYTES
    assert split.info["rollout_pool"] == ("gen", 4) and split.info["rollout_rows_per_engine"] == 512  # DP2
    print(f"rollout pool peak {(budget + receive + RUNTIME_OVERHEAD_BYTES) / GIB:.2f} GiB "
          f"(receive buffers {receive / GIB:.2f} GiB)")
    # a reward model mapped to the rollout's pool moves there from the actor's pool
    rm = ["reward_model.enable=true", f"reward_model.path={write_config(model.parent, 'Qwen2-1.5B')}"]
    _, on_actor = planned(model, [*SPLIT, *rm])
    _, on_rollout = planned(model, [*SPLIT, *rm, "trainer.placement.roles.reward_model=gen"])
    held = by_pool(on_actor, "actor")["start"].parts["reward_model"]
    assert held > 0 and all(ph.parts["reward_model"] == 0 for ph in by_pool(on_actor, "rollout").values())
    assert all(ph.parts["reward_model"] == held for ph in by_pool(on_rollout, "rollout").values())
    assert all(ph.parts["reward_model"] == 0 for ph in by_pool(on_rollout, "actor").values())


def test_split_decides_what_fits_on_each_pool(model):
    # u=0.75: vLLM next to the actor does not fit, on GPUs of its own it does
    _, colocated = planned(model, ["rollout.gpu_memory_utilization=0.75"])
    _, split = planned(model, [*SPLIT, "rollout.gpu_memory_utilization=0.75"])
    assert not colocated.fits and split.fits
    # u=0.95: the actor's pool fits, the rollout's does not (vLLM + receive buffers > the GPU)
    _, split = planned(model, [*SPLIT, "rollout.gpu_memory_utilization=0.95"])
    assert {ph.pool for ph in split.over} == {"rollout"} and [ph.name for ph in split.over] == ["sync"]
    # too little KV cache on the rollout pool's GPUs: a problem naming the pool and the settings
    _, small = planned(model, [*SPLIT, "rollout.gpu_memory_utilization=0.1"])
    assert len(small.problems) == 1 and "rollout pool 'gen' (4 GPUs)" in small.problems[0]
    assert "rollout.tensor_model_parallel_size=2" in small.problems[0]


def test_preflight_refuses_a_rollout_pool_that_does_not_fit(model, tmp_path, monkeypatch):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tokenizer import save_tiny_tokenizer
    from verl_mp.trainer.setup import preflight

    train, _ = write_synthetic_dataset(tmp_path / "data", num_train=16, num_test=4)
    save_tiny_tokenizer(model)
    monkeypatch.setenv("VERL_MP_MAX_CPU_RANKS", "64")  # GPU ranks, not CPU ones
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # no local Ray is started by preflight then
    base = [f"model.path={model}", f"data.train_files=[{train}]", "trainer.gpu_memory_gib=79.6", *SPLIT]
    preflight(load_config(PRESET, base))  # the preset with its rollout on 4 GPUs of its own fits
    with pytest.raises(ValueError) as err:
        preflight(load_config(PRESET, [*base, "rollout.gpu_memory_utilization=0.95"]))
    msg = str(err.value)
    assert "sync on the rollout pool 'gen' (4 GPUs) needs" in msg
    assert "lower rollout.gpu_memory_utilization" in msg and "rollout.tensor_model_parallel_size" in msg
    assert "Fixes: [rollout.gpu_memory_utilization=0.9]" in msg  # the largest share that fits, re-planned
    with pytest.raises(ValueError, match=r"rollout pool 'gen'.*raise rollout\.gpu_memory_utilization or "
                                         r"rollout\.tensor_model_parallel_size=2 .*Fixes: "
                                         r"\[rollout\.tensor_model_parallel_size=4\] -> peak"):
        check_fits(load_config(PRESET, [*base, "rollout.gpu_memory_utilization=0.1"]), read_spec(model), H100)


def test_cli_prints_both_pools(model, capsys):
    assert cli_main(["plan", "--config-name", PRESET, f"model.path={model}", *SPLIT, "--gpu-memory-gib", "79.6"]) == 0
    out = capsys.readouterr().out
    assert "rollout on its own pool 'gen': 4 GPUs, rollout TP2 x DP2" in out
    rows = [line.split()[:2] for line in out.splitlines() if line.split()[1:2] in (["actor"], ["rollout"])]
    assert ["update_actor", "actor"] in rows and ["sync", "actor"] in rows
    assert ["generate", "rollout"] in rows and ["sync", "rollout"] in rows
    assert ["generate", "actor"] not in rows


def test_a_reward_model_on_the_critics_pool_is_planned_there(model):
    """Roles on one pool share its processes (`verl_mp.plan`): a reward model placed with a
    critic on its own pool counts in the critic pool's phases (what it costs in the actor's
    pool when colocated there), and only there."""
    preset = "qwen2_5_7b_ppo_critic_pool_16gpu"
    rm = [f"model.path={model}", "reward_model.enable=true",
          f"reward_model.path={write_config(model.parent, 'Qwen2-1.5B')}"]

    def planned_with(*extra):
        return plan_memory(load_config(preset, [*rm, *extra]), read_spec(model), MemoryPlanOptions(gpu_memory_gib=H100))

    colocated, shared = planned_with(), planned_with("trainer.placement.roles.reward_model=critic")
    alone = plan_memory(load_config(preset, [f"model.path={model}"]), read_spec(model), MemoryPlanOptions(gpu_memory_gib=H100))
    held = by_pool(colocated, "actor")["start"].parts["reward_model"]
    assert held > 1e9  # ~1.5B parameters in bf16
    assert all(ph.parts["reward_model"] == 0 for ph in by_pool(shared, "actor").values())
    for name, ph in by_pool(shared, "critic").items():
        assert ph.parts["reward_model"] == held
        assert ph.total - by_pool(alone, "critic")[name].total == held
