"""trainer.placement, critic.megatron and reward_model: bad settings stop before any
process starts with an error naming the setting; good ones resolve as documented; the
role router sends each call to its role's group."""

import re

import pytest
import torch

from verl_mp.config.loader import load_config
from verl_mp.config.placement import resolve_placement
from verl_mp.trainer import main as trainer_main
from verl_mp.workers.reward_model import shard
from verl_mp.workers.router import RoleRouter

pytestmark = pytest.mark.unit

SPLIT = ["trainer.launcher=ray", "trainer.placement.pools.critic=[1]", "trainer.placement.roles.critic=critic"]


@pytest.mark.parametrize("overrides,message", [
    (["trainer.launcher=ray", "trainer.placement.roles.critic=nope"],
     r"trainer.placement.roles.critic='nope' is not a pool; defined pools: \['global'\]"),
    (["trainer.launcher=ray", "trainer.placement.roles.judge=global"],
     r"trainer.placement.roles.judge: unknown role; valid roles: \['actor_rollout_ref', 'critic', 'reward_model'\]"),
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
    rc = trainer_main.main(["--config-name", "ppo", *inputs, *overrides])
    assert rc == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_reward_model_with_several_labels_is_refused(inputs, nothing_starts, capsys, tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(num_labels=2).save_pretrained(tmp_path)
    rc = trainer_main.main(["--config-name", "grpo", *inputs, "reward_model.enable=true", f"reward_model.path={tmp_path}"])
    assert rc == 2 and "has num_labels=2; a reward model outputs one score" in capsys.readouterr().err


def test_default_is_one_colocated_pool():
    p = resolve_placement(load_config("ppo", ["trainer.nproc=4"]))
    assert p.pools == {"global": [4]}
    assert all(p.colocated(r) for r in ("critic", "reward_model")) and not p.multi_node


def test_split_preset_resolves():
    cfg = load_config("ppo_split", ["trainer.nproc=4", "trainer.placement.pools.critic=[2, 2]"])
    p = resolve_placement(cfg)
    assert p.roles == {"actor_rollout_ref": "global", "critic": "critic", "reward_model": "global"}
    assert p.pool_size("critic") == 4 and p.node_counts("critic") == [2, 2] and p.multi_node
    assert not p.colocated("critic") and p.num_ranks == 8
    assert cfg.critic.megatron.tensor_model_parallel_size == 1


@pytest.mark.parametrize("n,world", [(0, 2), (5, 2), (7, 3), (2, 4)])
def test_shards_cover_the_items_in_order(n, world):
    items = list(range(n))
    parts = [shard(items, r, world) for r in range(world)]
    assert sum(parts, []) == items and max(map(len, parts)) - min(map(len, parts)) <= 1


class _Group:
    def __init__(self, name, world_size=1):
        self.name, self.world_size, self.calls = name, world_size, []

    def __getattr__(self, method):
        def call(*args):
            self.calls.append(method)
            if method == "model_info":
                return {"flop_params": 7, "world_size": self.world_size}
            return self.name
        return call

    def scatter(self, method, items):
        self.calls.append(f"scatter:{method}")
        return [torch.tensor([float(len(items))]), torch.tensor([1.0])]


def test_router_sends_each_role_to_its_group():
    actor, critic, rm = _Group("actor", 2), _Group("critic", 1), _Group("rm")
    router = RoleRouter(actor, critic=critic, reward_model=rm)
    assert router.compute_values(None) == "critic" and router.update_critic(None) == "critic"
    assert router.update_actor(None) == "actor" and router.compute_log_probs(None, "ref") == "actor"
    assert router.score_sequences(["a", "b"]).tolist() == [2.0, 1.0]
    router.save_checkpoint("/ckpt")
    assert "save_checkpoint" in actor.calls and "save_checkpoint" in critic.calls and "save_checkpoint" not in rm.calls
    assert router.model_info() == {"flop_params": 7, "world_size": 3}


def test_router_without_split_forwards_to_the_actor_group():
    actor = _Group("actor")
    router = RoleRouter(actor)
    assert router.compute_values(None) == "actor" and router.score_sequences(["a"]) == "actor"
    router.load_checkpoint("/ckpt")
    assert actor.calls.count("load_checkpoint") == 1
