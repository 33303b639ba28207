"""trainer.placement, critic.megatron and reward_model: bad settings stop before any
process starts with an error naming the setting; good ones resolve as documented; the
role router sends each call to its role's group."""

import re

import pytest
import torch

from verl_mp.cli import main as cli_main
from verl_mp.config.loader import load_config
from verl_mp.config.placement import resolve_placement
from verl_mp.plan import build_plan, enabled_roles
from verl_mp.workers.groups import WorkerGroups
from verl_mp.workers.protocol import ForwardRequest, ForwardResult, UpdateRequest
from verl_mp.workers.rank_worker import shard

pytestmark = pytest.mark.unit

SPLIT = ["trainer.launcher=ray", "trainer.placement.pools.critic=[1]", "trainer.placement.roles.critic=critic"]


@pytest.mark.parametrize("overrides,message", [
    (["trainer.launcher=ray", "trainer.placement.roles.critic=nope"],
     r"trainer.placement.roles.critic='nope' is not a pool; defined pools: \['global'\]"),
    (["trainer.launcher=ray", "trainer.placement.roles.judge=global"],
     r"trainer.placement.roles.judge: unknown group; valid groups: \['actor_rollout_ref', 'critic', 'reward_model', 'rollout'\]"),
    (["trainer.placement.pools.critic=[1]", "trainer.placement.roles.critic=critic"],
     r"puts \['critic'\] on a pool apart from actor_rollout_ref, which needs trainer.launcher=ray"),
    (["trainer.launcher=ray", "trainer.placement.pools.train=[4]", "trainer.placement.roles.actor_rollout_ref=train"],
     r"trainer.placement.pools.train=\[4\] hosts actor_rollout_ref but trainer.nnodes=1 x trainer.nproc=2 is \[2\]"),
    (["trainer.launcher=ray", "trainer.placement.pools.spare=[2]"],
     r"trainer.placement.pools \['spare'\] host no role of this run"),
    ([*SPLIT, "trainer.placement.pools.critic=[0]"],
     r"trainer.placement.pools.critic=\[0\]: give one positive rank count per node"),
    ([*SPLIT, "critic.megatron.tensor_model_parallel_size=3"],
     r"critic.megatron.tensor_model_parallel_size=3 .*the critic pool 'critic' has 1 ranks"),
    ([*SPLIT, "actor.megatron.tensor_model_parallel_size=2"],
     r"world size 1 is not divisible by critic.megatron.tensor_model_parallel_size=2.*critic.megatron is unset"),
    ([*SPLIT, "trainer.placement.pools.critic=[3]", "critic.megatron.tensor_model_parallel_size=1"],
     r"must be divisible by the critic's data-parallel size 3 \(pool 'critic'\)"),
    (["critic.megatron.tensor_model_parallel_size=2"],
     r"critic.megatron differs from actor.megatron, but the critic is colocated"),
    ([*SPLIT, "trainer.placement.pools.critic=[1, 1]"],
     r"span several nodes .*set RAY_ADDRESS"),
    ([*SPLIT, "trainer.placement.pools.critic=[64]"],
     r"the ranks of all trainer.placement pools together=66 asks for more ranks"),
    (["reward_model.enable=true"], r"reward_model.path='' is not an HF checkpoint directory"),
    (["reward_model.enable=true", "reward_model.path=/nonexistent"], r"reward_model.path='/nonexistent'"),
    (["reward_model.combine=mix"], r"reward_model.combine='mix' is not one of \('add', 'replace'\)"),
    (["trainer.launcher=ray", "trainer.placement.pools.rm=[1]", "trainer.placement.roles.reward_model=rm"],
     r"pools \['rm'\] host no role of this run .*reward_model.enable: False"),
])
def test_preflight_refuses(inputs, nothing_starts, capsys, overrides, message):
    rc = cli_main(["train", "--config-name", "ppo", *inputs, *overrides])
    assert rc == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_reward_model_with_several_labels_is_refused(inputs, nothing_starts, capsys, tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(num_labels=2).save_pretrained(tmp_path)
    rc = cli_main(["train", "--config-name", "grpo", *inputs, "reward_model.enable=true", f"reward_model.path={tmp_path}"])
    assert rc == 2 and "has num_labels=2; a reward model outputs one score" in capsys.readouterr().err


def _placement(cfg):
    return resolve_placement(cfg.trainer, enabled_roles(cfg))


def test_default_is_one_colocated_pool():
    p = _placement(load_config("ppo", ["trainer.nproc=4"]))
    assert p.pools == {"global": [4]}
    assert all(p.colocated(r) for r in ("critic", "reward_model")) and not p.multi_node


def test_split_preset_resolves():
    cfg = load_config("ppo_split", ["trainer.nproc=4", "trainer.placement.pools.critic=[2, 2]"])
    p = _placement(cfg)
    assert p.roles == {"actor_rollout_ref": "global", "critic": "critic", "reward_model": "global",
                       "rollout": "global"}
    assert p.pool_size("critic") == 4 and p.node_counts("critic") == [2, 2] and p.multi_node
    assert not p.colocated("critic") and p.num_ranks == 8
    assert cfg.critic.megatron.tensor_model_parallel_size == 1


@pytest.mark.parametrize("n,world", [(0, 2), (5, 2), (7, 3), (2, 4)])
def test_shards_cover_the_items_in_order(n, world):
    items = list(range(n))
    parts = [shard(items, r, world) for r in range(world)]
    assert sum(parts, []) == items and max(map(len, parts)) - min(map(len, parts)) <= 1


class _Group:
    """A worker group that records calls and answers like rank 0 would."""

    def __init__(self, name):
        self.name, self.calls = name, []

    def submit(self, method, *args):
        self.calls.append(method.__name__)
        if method.__name__ == "forward":
            request = args[1]
            return ForwardResult(old_log_probs=torch.ones(1) if request.old_log_probs and self.name != "critic" else None,
                                 values=torch.zeros(1) if request.values and self.name == "critic" else None,
                                 metrics={f"timing/{self.name}_s": 1.0})
        if method.__name__ == "update":
            return {f"{self.name}/loss": 1.0}
        return self.name

    def result(self, handle):
        return handle


def _groups(split: bool):
    cfg = load_config("ppo_split" if split else "ppo", ["model.path=m", "reward_model.enable=true"]
                      + (["trainer.placement.pools.rm=[1]", "trainer.placement.roles.reward_model=rm"] if split else []))
    plan = build_plan(cfg)
    return plan, {name: _Group(name) for name in plan.groups}


def test_split_plan_fans_each_phase_out_to_the_groups_hosting_its_roles():
    plan, groups = _groups(split=True)
    assert {n: g.roles for n, g in plan.groups.items()} == {
        "actor_rollout_ref": ["actor", "rollout", "ref"], "critic": ["critic"], "reward_model": ["reward_model"]}
    workers = WorkerGroups(plan, groups)
    fwd = workers.forward(None, ForwardRequest(ref_log_probs=True, values=True))
    assert fwd.old_log_probs is not None and fwd.values is not None
    assert set(fwd.metrics) == {"timing/actor_rollout_ref_s", "timing/critic_s"}
    assert workers.update(None, UpdateRequest(critic=True)) == {"actor_rollout_ref/loss": 1.0, "critic/loss": 1.0}
    assert workers.score(["a"]) == "reward_model" and workers.generate([[1]], None) == "actor_rollout_ref"
    workers.save_checkpoint("/ckpt")
    assert groups["critic"].calls == ["forward", "update", "save_checkpoint"]
    assert groups["reward_model"].calls == ["score"]
    assert workers.step_counters()["perf/driver_round_trips"] == 5  # forward, update, score, generate, save


def test_colocated_plan_sends_every_phase_to_one_group():
    plan, groups = _groups(split=False)
    assert list(plan.groups) == ["actor_rollout_ref"]
    assert plan.groups["actor_rollout_ref"].roles == ["actor", "rollout", "ref", "critic", "reward_model"]
    workers = WorkerGroups(plan, groups)
    workers.forward(None, ForwardRequest(ref_log_probs=True, values=True))
    workers.update(None, UpdateRequest(critic=True))
    workers.load_checkpoint("/ckpt")
    assert groups["actor_rollout_ref"].calls == ["forward", "update", "load_checkpoint"]
