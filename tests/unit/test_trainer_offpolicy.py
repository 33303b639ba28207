"""The driver-side parts of off-policy training, without processes: which weights generate
each step's samples (`RolloutSource`), its checkpoint of what is in flight, dynamic
sampling (`fill_groups`), the pools' idle/overlap accounting (`PoolClock`), and the
preflight refusals of these settings."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_mp.config.loader import load_config
from verl_mp.config.rollout import SamplingConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.sampler import ResumableBatchSampler
from verl_mp.rollout.types import RolloutOutput
from verl_mp.trainer.dynamic_sampling import ScoredSamples, fill_groups, informative_groups
from verl_mp.trainer.pool_clock import PoolClock, clipped_union, overlap
from verl_mp.trainer.rollout_source import RolloutSource

pytestmark = pytest.mark.unit
N = 2  # samples per prompt


class _Prompts:
    """Prompt i is the token list [i] (what PromptDataset.get_batch returns, in memory)."""

    def get_batch(self, indices):
        return PromptBatch(input_ids=[[int(i)] for i in indices], prompts=[f"p{i}" for i in indices],
                           ground_truths=["g"] * len(indices), data_sources=["s"] * len(indices),
                           indices=[int(i) for i in indices])


class _OrderedRollout:
    """A rollout group that runs its calls one at a time in the order they were made, as a
    Ray actor does; a generation's samples record the weight version it ran with."""

    def __init__(self, version=0):
        self.queue, self.done, self.version = [], {}, version

    def submit_generate(self, prompt_ids, sampling, record_routing=False):
        self.queue.append(("generate", prompt_ids, sampling, record_routing))
        return len(self.queue) - 1

    def sync(self, version):
        self.queue.append(("sync", version))

    def wait(self, call):
        if call in self.done:
            return self.done[call]
        for i, item in enumerate(self.queue):
            if i in self.done:
                continue
            if item[0] == "sync":
                self.version, self.done[i] = item[1], None
            else:
                _, prompts, sampling, record_routing = item
                resp = [[p[0], sampling.seed, self.version] for p in prompts for _ in range(N)]
                # routing [prompt + response, 2 layers, k=2] that names the sample and the weights
                routing = [(torch.full((1 + len(r), 2, 2), r[0] * 10 + self.version) + torch.tensor([0, 1])).short()
                           for r in resp] if record_routing else None  # a token's two experts are distinct
                self.done[i] = RolloutOutput(prompt_ids=prompts, response_ids=resp,
                                             response_logprobs=[[-0.5] * 3 for _ in resp], n=N,
                                             finished=[True] * len(resp), wall_start=1.0 * i, wall_end=i + 0.5,
                                             routed_experts=routing)
            if i == call:
                return self.done[i]
        raise AssertionError("waited for a call never made")

    def generate(self, prompt_ids, sampling, record_routing=False):
        return self.wait(self.submit_generate(prompt_ids, sampling))


def _source(ahead, rollout=None, sampler=None, record_routing=False):
    sampling = lambda step, r: SamplingConfig(n=N, seed=step * 100 + r)  # noqa: E731
    return RolloutSource(rollout or _OrderedRollout(), _Prompts(), sampler or ResumableBatchSampler(40, 2, seed=3),
                         sampling, ahead=ahead, record_routing=record_routing)


def _run(source, first, last, trace, total=6):
    """The trainer's order of calls for steps first..last of a run of ``total`` steps;
    records (step, prompt indices, version used, samples)."""
    for step in range(first, last + 1):
        gen = source.take(step)
        used = {r[2] for r in gen.out.response_ids}
        assert used == {gen.version}, "the version tag must be the weights that generated the samples"
        source.prefetch(step, total)
        routing = None if gen.out.routed_experts is None else [r.tolist() for r in gen.out.routed_experts]
        trace.append((step, gen.prompts.indices, gen.version, gen.out.response_ids, routing))
        source.workers.sync(step)  # the update of this step, then its weight sync
        source.synced(step)


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_versions_and_staleness_bound(ahead):
    trace = []
    _run(_source(ahead), 1, 6, trace)
    staleness = [step - 1 - version for step, _, version, _, _ in trace]
    assert max(staleness) == ahead and all(s == ahead for s in staleness[ahead:])  # steady state: exactly K
    assert staleness[:ahead] == list(range(ahead))  # the first steps are fresher
    assert [t[1] for t in trace] == [[i for i in sampler_batch] for sampler_batch in _batches(6)]


def _batches(num):
    sampler = ResumableBatchSampler(40, 2, seed=3)
    return [sampler.next_batch() for _ in range(num)]


@pytest.mark.parametrize("routing", [False, True], ids=["", "with routing"])
@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_checkpoint_with_steps_in_flight_resumes_exactly(ahead, routing, tmp_path):
    """Stop after step 3 (what is in flight is saved as JSON with the sampler; its routed
    experts, with routing replay, as safetensors beside it), resume with a fresh rollout
    holding the checkpoint's weights: steps 4-6 are what they were, routing included."""
    full = []
    _run(_source(ahead, record_routing=routing), 1, 6, full)
    first, sampler = [], ResumableBatchSampler(40, 2, seed=3)
    source = _source(ahead, sampler=sampler, record_routing=routing)
    _run(source, 1, 3, first)
    saved = json.loads(json.dumps({"source": source.state_dict(), "sampler": sampler.state_dict()}))
    assert len(saved["source"]["pending"]) == min(ahead, 3)
    tensors = source.routing_state()
    assert bool(tensors) == (routing and ahead > 0)
    save_file(tensors, tmp_path / "r.safetensors")

    sampler2 = ResumableBatchSampler(40, 2, seed=3)
    sampler2.load_state_dict(saved["sampler"])
    resumed = _source(ahead, rollout=_OrderedRollout(version=3), sampler=sampler2, record_routing=routing)
    resumed.load_state_dict(saved["source"], load_file(tmp_path / "r.safetensors"))
    resumed.synced(3)
    rest = []
    _run(resumed, 4, 6, rest)
    assert first + rest == full
    if routing and ahead:  # routing of a generation in flight, without its tensors: refused by name
        with pytest.raises(ValueError, match="generation in flight for step 4 recorded routed experts"):
            _source(ahead).load_state_dict(saved["source"], {})
    if ahead and not routing:  # replay asked for, but what is in flight recorded no routing
        with pytest.raises(ValueError, match="generation in flight for step 4 was made without recording"):
            _source(ahead, record_routing=True).load_state_dict(saved["source"], {})


def test_generate_now_draws_new_prompts_with_the_current_weights():
    source = _source(1)
    source.take(1)
    source.prefetch(1, 5)  # step 2 in flight with version 0
    source.workers.sync(1)
    source.synced(1)
    more = source.generate_now(2, 1)
    assert more.version == 1 and {r[2] for r in more.out.response_ids} == {1}
    assert {r[1] for r in more.out.response_ids} == {201}  # seeded by (step, round)
    assert source.take(2).version == 0


def _scored(scores, first_index=0):
    groups = len(scores) // N
    prompts = _Prompts().get_batch(range(first_index, first_index + groups))
    out = RolloutOutput(prompt_ids=prompts.input_ids, response_ids=[[i] for i in range(len(scores))],
                        response_logprobs=None, n=N, finished=[True] * len(scores))
    return ScoredSamples(prompts, out, torch.tensor(scores, dtype=torch.float32),
                         torch.full((len(scores),), first_index, dtype=torch.int64), {"reward/score/mean": 0.5})


def test_informative_groups():
    assert informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), 2).tolist() == [False, True, False]


def test_fill_groups_refills_from_new_rounds_in_order():
    first = _scored([1, 1, 0, 1, 0, 0, 1, 0])        # groups 0..3: informative 1 and 3
    rounds = {1: _scored([0, 1, 1, 1, 1, 1, 0, 1], first_index=10)}  # 10 and 13 informative
    asked = []

    def next_round(r):
        asked.append(r)
        return rounds[r]

    batch, m = fill_groups(first, next_round, target_groups=3, max_extra_rounds=2)
    assert asked == [1]  # stopped once 3 informative groups were found
    assert batch.prompts.indices == [1, 3, 10] and batch.scores.tolist() == [0, 1, 1, 0, 0, 1]
    assert batch.versions.tolist() == [0, 0, 0, 0, 10, 10]
    assert m == {"filter/kept_groups": 3.0, "filter/dropped_groups": 4.0, "filter/dropped_frac": 0.5,
                 "filter/extra_rounds": 1.0, "filter/generated_samples": 16.0, "filter/topped_up_groups": 0.0}
    assert batch.reward_metrics == {"reward/score/mean": 0.5}


def test_fill_groups_tops_up_with_dropped_groups_when_rounds_run_out():
    first = _scored([1, 1, 0, 1, 0, 0])
    batch, m = fill_groups(first, lambda r: _scored([2, 2, 3, 3, 4, 4], first_index=10 * r), 3, max_extra_rounds=1)
    assert batch.prompts.indices == [1, 0, 2]  # the informative one, then dropped ones in generation order
    assert m["filter/topped_up_groups"] == 2.0 and m["filter/extra_rounds"] == 1.0
    assert m["filter/dropped_groups"] == 5.0
    no_rounds, m0 = fill_groups(first, lambda r: pytest.fail("no extra round allowed"), 3, max_extra_rounds=0)
    assert no_rounds.prompts.indices == [1, 0, 2] and m0["filter/extra_rounds"] == 0.0


def test_interval_arithmetic():
    assert clipped_union([(0, 2), (1, 3), (5, 6)], (1, 5.5)) == 2.5
    assert overlap([(0, 4)], [(1, 2), (3, 6)], (0, 10)) == 2.0
    assert overlap([(0, 1)], [(2, 3)], (0, 10)) == 0.0


def test_pool_clock_split_and_colocated():
    split = PoolClock(colocated=False)
    split.phase("forward", 1, 2)
    split.phase("update", 2, 4)
    split.phase("weight_sync", 5, 6)
    split.generation(0, 3)
    m = split.step_metrics((0, 6))
    assert m["timing/gen_train_overlap_s"] == 2.0  # generation [0, 3] while training [1, 4]
    assert m["timing/idle_rollout_s"] == 2.0 and m["timing/idle_train_s"] == 2.0  # [3, 5]; [0, 1] + [4, 5]
    assert m["perf/idle_frac_rollout"] == pytest.approx(1 / 3)
    together = PoolClock(colocated=True)
    together.generation(0, 1)
    together.phase("forward", 1, 2)
    together.phase("weight_sync", 2, 3)
    m = together.step_metrics((0, 4))
    assert m["timing/idle_train_s"] == m["timing/idle_rollout_s"] == 1.0 and m["timing/gen_train_overlap_s"] == 0


SPLIT = ["trainer.launcher=ray", "trainer.placement.pools.gen=[2]", "trainer.placement.roles.rollout=gen"]


@pytest.mark.parametrize("overrides,message", [
    (["trainer.off_policy_steps=1"], r"trainer.off_policy_steps=1 needs the rollout on a pool of its own"),
    ([*SPLIT, "rollout.weight_sync_mode=local"], r"rollout.weight_sync_mode=local copies shards inside"),
    (["data.filter_groups.enable=true", "rollout.sampling.n=1"], r"rollout.sampling.n=1 must be >= 2"),
    (["trainer.off_policy_steps=-1"], r"trainer.off_policy_steps=-1 must be >= 0"),
    (["data.filter_groups.max_extra_rounds=-1"], r"max_extra_rounds=-1 must be >= 0"),
    ([*SPLIT, "reward_model.enable=true", "reward_model.path=rm", "trainer.placement.roles.reward_model=gen"],
     r"trainer.placement.roles.rollout='gen' is also the pool of reward_model: .* give reward_model another pool"),
])
def test_preflight_refuses(tmp_path, overrides, message):
    from verl_mp.trainer.config_check import config_errors
    from verl_mp.utils.errors import ConfigErrors

    with pytest.raises(ValueError, match=message):
        cfg = load_config("grpo", overrides)
        raise ConfigErrors(config_errors(cfg) or ["no error"])


def test_plan_puts_the_rollout_in_a_group_of_its_own():
    from verl_mp.plan import build_plan

    cfg = load_config("grpo", [*SPLIT, "model.path=unused"])
    plan = build_plan(cfg)
    assert plan.groups["actor_rollout_ref"].roles == ["actor", "ref"] and plan.groups["rollout"].roles == ["rollout"]
    assert plan.groups["rollout"].pool == "gen" and plan.rollout_apart
    colocated = build_plan(load_config("grpo", ["model.path=unused"]))
    assert colocated.groups["actor_rollout_ref"].roles == ["actor", "rollout", "ref"] and not colocated.rollout_apart
