"""The run plan: every engine setting of the run config reaches the engine configs, roles
follow from the algorithm, and plan.yaml round-trips exactly."""

import pytest

from dataclasses import fields, is_dataclass

from verl_mp.algo import advantage_estimator, estimator_spec
from verl_mp.config.engine import MAY_DIFFER_ON_RESUME, EngineSettings
from verl_mp.config.loader import load_config
from verl_mp.plan import build_plan, load_plan, save_plan
from verl_mp.planner import MemoryPlanOptions
from verl_mp.planner import plan_memory as _plan
from verl_mp.trainer.resume_check import config_differences, run_config


def plan_memory(cfg, spec):
    return _plan(cfg, spec, MemoryPlanOptions(gpu_memory_gib=80))

pytestmark = pytest.mark.unit

SECTIONS = ("actor", "ref", "critic")
VALUES = {  # every EngineSettings key -> a non-default value (a new field needs an entry here)
    "micro_batch_size": 3,
    "max_tokens_per_micro_batch": 512,
    "remove_padding": True,
    "attention_backend": "sdpa",
    "recompute": "full",
    "recompute_modules": ["core_attn"],
    "recompute_num_layers": 2,
    "offload.params": True,
    "offload.grads": True,
    "offload.optimizer": True,
    "optim.lr": 0.123,
    "optim.use_distributed_optimizer": False,
}
LIVE = {"ref": ("micro_batch_size", "max_tokens_per_micro_batch", "remove_padding", "attention_backend",
                "offload.params")}
"""What each role has (the reference policy has no others: `verl_mp.config.schema.ReferenceConfig`)."""
BASE = ["model.path=m", "actor.use_kl_loss=true", "actor.recompute=selective", "critic.recompute=selective"]


def _leaf_keys(cls):
    keys = []
    for f in fields(cls):
        default = getattr(cls(), f.name)
        if f.name == "optim":  # two of its keys: the section travels to the engine as one object
            keys += ["optim.lr", "optim.use_distributed_optimizer"]
        elif is_dataclass(default):
            keys += [f"{f.name}.{k}" for k in _leaf_keys(type(default))]
        else:
            keys.append(f.name)
    return keys


def _read(obj, key):
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_engine_setting_has_a_value_to_walk():
    assert sorted(_leaf_keys(EngineSettings)) == sorted(VALUES)


def _cases():
    return [(s, k) for s in SECTIONS for k in VALUES if s not in LIVE or k in LIVE[s]]


@pytest.fixture(scope="module")
def spec():
    from verl_mp.models.hf_config import spec_from_hf_config
    from verl_mp.planner.known_models import MODEL_CONFIGS

    return spec_from_hf_config(dict(MODEL_CONFIGS["Qwen2-1.5B"]), source="Qwen2-1.5B")


@pytest.fixture(scope="module")
def default(spec):
    cfg = load_config("ppo", BASE)
    return cfg, build_plan(cfg), plan_memory(cfg, spec)


@pytest.mark.parametrize("section,key", _cases(), ids=[f"{s}.{k}" for s, k in _cases()])
def test_every_engine_key_reaches_its_engine_the_planner_and_the_resume_check(section, key, spec, default):
    """YAML/CLI -> the plan's EngineConfig (what the ranks build from; tests/e2e/test_train_cli.py
    reads it back from the ranks) -> the memory planner's engine -> the resume check."""
    value = False if (section, key) == ("ref", "offload.params") else VALUES[key]  # the reference's default is True
    text = "[" + ",".join(value) + "]" if isinstance(value, list) else value
    cfg = load_config("ppo", [*BASE, f"{section}.{key}={text}"])
    run_plan = build_plan(cfg)
    default_cfg, default_plan, default_memory = default
    assert _read(run_plan.engine(section), key) == value != _read(default_plan.engine(section), key)
    for other in (s for s in SECTIONS if s != section):  # the other roles keep their own value
        assert _read(run_plan.engine(other), key) == _read(default_plan.engine(other), key)

    memory = plan_memory(cfg, spec)
    assert memory.engines[section].settings == run_plan.engine(section)  # the planner plans what the ranks get
    assert memory.engines[section] != default_memory.engines[section] or key in NOT_MODELLED, key

    changed = [k for k, _, _ in config_differences(run_config(default_cfg), run_config(cfg))]
    may_differ = {f.name: dict(f.metadata) for f in fields(EngineSettings)}[key.split(".")[0]] == MAY_DIFFER_ON_RESUME
    assert changed == ([] if may_differ else [f"{section}.{key}"]), changed


NOT_MODELLED = {"remove_padding", "attention_backend", "recompute_num_layers", "optim.lr"}
"""Settings that change no memory term of the planner (its rows are padded at the worst case)."""


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


def test_the_plan_sends_the_update_settings_not_whole_sections():
    from verl_mp.config.schema import PolicyUpdateConfig, ValueUpdateConfig

    cfg = load_config("ppo", ["model.path=m", "actor.clip_ratio_high=0.28", "actor.ppo_epochs=2",
                              "critic.cliprange_value=0.3", "actor.router_replay=old_logprob"])
    plan = build_plan(cfg)
    assert type(plan.actor_loss) is PolicyUpdateConfig and type(plan.critic_loss) is ValueUpdateConfig
    assert (plan.actor_loss.clip_ratio_high, plan.actor_loss.ppo_epochs, plan.critic_loss.cliprange_value) == (0.28, 2, 0.3)
    assert plan.router_replay == "old_logprob"


ONE_STEP = ["model.path=m", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8"]


@pytest.mark.parametrize("extra, in_update", [
    ([], True),  # one optimizer step on fresh samples: the update's forward gives the old log-probs
    (["actor.old_log_probs=forward"], False),
    (["actor.ppo_mini_batch_size=4"], False),  # two optimizer steps: the second's ratio needs the first's weights
    (["actor.ppo_epochs=2"], False),
    (["trainer.off_policy_steps=1"], False),  # stale samples: old != rollout weights, and the gap is per fresh row
    (["algorithm.rollout_correction.is_level=token"], False),  # its weights are computed before the update
    (["algorithm.use_kl_in_reward=true"], False),  # the reward's KL penalty reads them before the update
    (["actor.router_replay=old_logprob"], False),  # that pass records the routing the update replays
    (["rollout.logprob_diff_threshold=0.1"], False),  # its check refuses a bad sync before the update
    (["rollout.multi_turn.enable=true", "rollout.multi_turn.carry_over=true",
      "algorithm.rollout_correction.is_level=token"], False),
])
def test_old_log_probs_come_from_the_update_only_where_that_is_exact(extra, in_update):
    plan = build_plan(load_config("grpo", [*ONE_STEP, *extra]))
    assert plan.old_log_probs_in_update is in_update


def test_old_log_probs_setting_is_checked():
    with pytest.raises(ValueError, match=r"actor.old_log_probs='update' is not one of \('auto', 'forward'\)"):
        load_config("grpo", ["model.path=m", "actor.old_log_probs=update"])
