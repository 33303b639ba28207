"""The run plan: every engine setting of the run config reaches the engine configs, roles
follow from the algorithm, and plan.yaml round-trips exactly."""

import pytest

from verl_mp.algo import advantage_estimator, estimator_spec
from verl_mp.config.loader import load_config
from verl_mp.plan import build_plan, load_plan, save_plan

pytestmark = pytest.mark.unit

SECTIONS = ("actor", "ref", "critic")
# run-config field -> (EngineConfig field, a non-default value)
FIELDS = {
    "micro_batch_size": ("micro_batch_size", 3),
    "max_tokens_per_micro_batch": ("max_tokens_per_micro_batch", 512),
    "remove_padding": ("remove_padding", True),
    "attention_backend": ("attention_backend", "sdpa"),
    "recompute": ("recompute", "full"),
    "recompute_num_layers": ("recompute_num_layers", 2),
    "offload.params": ("offload_params", True),
    "offload.grads": ("offload_grads", True),
    "offload.optimizer": ("offload_optimizer", True),
    "optim.lr": ("optim", None),
}


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("key", FIELDS)
def test_every_engine_key_reaches_its_engine(section, key):
    field, value = FIELDS[key]
    value = 0.123 if key == "optim.lr" else value
    if key == "offload.params" and section == "ref":
        value = False  # the reference's default is True
    base = ["model.path=m", "actor.use_kl_loss=true"]
    plan, default = build_plan(load_config("ppo", [*base, f"{section}.{key}={value}"])), build_plan(load_config("ppo", base))

    def read(engine):
        return engine.optim.lr if key == "optim.lr" else getattr(engine, field)

    assert read(getattr(plan, section)) == value != read(getattr(default, section))
    for other in (s for s in SECTIONS if s != section):  # the other roles keep their own value
        assert read(getattr(plan, other)) == read(getattr(default, other))


def test_roles_follow_the_algorithm():
    grpo = build_plan(load_config("grpo", ["model.path=m"]))
    assert grpo.critic is None and grpo.ref is not None  # KL loss needs the reference
    assert grpo.groups["actor_rollout_ref"].roles == ["actor", "rollout", "ref"]
    dapo = build_plan(load_config("dapo", ["model.path=m"]))
    assert dapo.critic is None and dapo.ref is None
    ppo = build_plan(load_config("ppo", ["model.path=m", "critic.enable=null"]))
    assert ppo.critic is not None and ppo.critic.role == "critic"  # gae declares it needs values


def test_roles_on_one_pool_share_its_group():
    rm = ["model.path=m", "trainer.launcher=ray", "reward_model.enable=true", "reward_model.path=rm"]
    shared = build_plan(load_config("ppo_split", [*rm, "trainer.placement.roles.reward_model=critic"]))
    assert {n: (g.pool, g.roles) for n, g in shared.groups.items()} == {
        "actor_rollout_ref": ("global", ["actor", "rollout", "ref"]), "critic": ("critic", ["critic", "reward_model"])}
    apart = build_plan(load_config("ppo_split", [*rm, "trainer.placement.pools.rm=[1]",
                                                 "trainer.placement.roles.reward_model=rm"]))
    assert [g.roles for g in apart.groups.values()] == [["actor", "rollout", "ref"], ["critic"], ["reward_model"]]


def test_a_plugin_estimator_declares_what_it_needs():
    @advantage_estimator(inputs=("values", "ref_log_probs"), params={"gamma": "gamma"})
    def needs_both(token_level_rewards, response_mask, values, ref_log_probs, gamma):
        raise NotImplementedError

    spec = needs_both.estimator_spec
    assert spec.needs_critic and spec.needs_reference and not spec.needs_greedy_baseline


def test_undecorated_plugin_spec_is_inferred_from_its_signature():
    spec = estimator_spec("tests.unit.test_plan:_plain_plugin")
    assert spec.inputs == ("values", "group_ids") and spec.params == {}


def _plain_plugin(token_level_rewards, response_mask, values, group_ids):
    raise NotImplementedError


def test_plan_yaml_round_trip(tmp_path):
    cfg = load_config("ppo_split", ["model.path=m", "trainer.nproc=2", "actor.recompute=selective",
                                    "critic.megatron.tensor_model_parallel_size=1"])
    plan = build_plan(cfg)
    save_plan(plan, tmp_path / "plan.yaml")
    assert load_plan(tmp_path / "plan.yaml") == plan
    assert plan.critic.parallel.tensor_model_parallel_size == 1
    assert plan.groups["critic"].roles == ["critic"] and plan.group_of("critic") == "critic"
    assert plan.rollout.dtype == cfg.model.dtype and plan.mini_batch_rows == 8 * 1
