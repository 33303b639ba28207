"""Settings the planner chooses when a run leaves them unset (`verl_mp.planner.choose`): the
token budget per engine role is the largest that keeps every phase under the headroom (one step
more does not, or the cap / the rank's mini-batch is reached), settings the run gives are
kept, a CPU run gets the fallback, preflight applies the choice to plan.yaml's engines, and
`verl-mp plan` prints it with its reason.

That token-budget micro-batches compute the same loss, gradients and update as fixed rows
(fp32) is `tests/dist/test_engine_hf.py::test_backends_sequence_parallel_packing_dynamic_batches_and_recompute_agree`
("dynamic" and "packed_dynamic" against "base")."""

import dataclasses
import json

import pytest

from verl_mp.config.loader import load_config
from verl_mp.config.engine import default_token_budget
from verl_mp.planner import MemoryPlanOptions, plan_memory
from verl_mp.planner.choose import BUDGET_CAP, BUDGET_STEP, HEADROOM, choose
from verl_mp.planner.cli import read_spec
from verl_mp.plan import build_plan

pytestmark = pytest.mark.unit
JOB = ["model.dtype=bf16", "trainer.nproc=1", "data.train_batch_size=256", "actor.ppo_mini_batch_size=256",
       "rollout.sampling.n=8", "rollout.sampling.max_new_tokens=1024", "data.max_prompt_length=64",
       "rollout.gpu_memory_utilization=0.4", "rollout.keep_weights_on_gpu=true"]
SEQ = 64 + 1024


@pytest.fixture(scope="module")
def body(tmp_path_factory):
    """config.json of the 1.5B body with the full Qwen2 vocabulary (the LM head's logits matter)."""
    path = tmp_path_factory.mktemp("choose")
    (path / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=4096, tie_word_embeddings=False)))
    return str(path)


def _peak_share(cfg, spec, options):
    result = plan_memory(cfg, spec, options)
    assert not result.problems
    return max(ph.total for ph in result.phases) / result.gpu_bytes


def _with(cfg, role, budget):
    return dataclasses.replace(cfg, **{role: dataclasses.replace(getattr(cfg, role), max_tokens_per_micro_batch=budget)})


@pytest.mark.parametrize("gib", [79.6, 140.4])
def test_each_budget_is_the_largest_that_fits_the_headroom(body, gib):
    cfg = load_config("grpo", [f"model.path={body}", *JOB])
    spec, options = read_spec(body), MemoryPlanOptions(gpu_memory_gib=gib)
    chosen, choices = choose(cfg, spec, options)
    got = {c.key.split(".")[0]: c.value for c in choices if c.key.endswith("max_tokens_per_micro_batch")}
    assert set(got) == {"actor", "ref"}  # GRPO: no critic
    assert _peak_share(chosen, spec, options) <= HEADROOM
    for role, budget in got.items():
        assert SEQ <= budget <= BUDGET_CAP[role] and getattr(chosen, role).max_tokens_per_micro_batch == budget
        if budget < BUDGET_CAP[role]:  # not capped: one step more breaks the headroom
            assert _peak_share(_with(chosen, role, budget + BUDGET_STEP), spec, options) > HEADROOM
    # the smaller GPU gets the smaller actor budget; the user's settings are kept as written
    assert cfg.actor.max_tokens_per_micro_batch is None and cfg.actor.micro_batch_size is None


def test_budgets_differ_by_gpu_and_settings_the_run_gives_are_kept(body):
    cfg = load_config("grpo", [f"model.path={body}", *JOB])
    spec = read_spec(body)
    small = choose(cfg, spec, MemoryPlanOptions(gpu_memory_gib=79.6))[0].actor.max_tokens_per_micro_batch
    large = choose(cfg, spec, MemoryPlanOptions(gpu_memory_gib=140.4))[0].actor.max_tokens_per_micro_batch
    assert small < large
    rows = load_config("grpo", [f"model.path={body}", *JOB, "actor.micro_batch_size=8"])
    budget = load_config("grpo", [f"model.path={body}", *JOB, "ref.max_tokens_per_micro_batch=4096"])
    kept, choices = choose(rows, spec, MemoryPlanOptions(gpu_memory_gib=140.4))
    assert kept.actor.micro_batch_size == 8 and kept.actor.max_tokens_per_micro_batch is None
    assert [c.key for c in choices] == ["ref.max_tokens_per_micro_batch", "rollout.cudagraph_max_tokens"]
    kept, choices = choose(budget, spec, MemoryPlanOptions(gpu_memory_gib=140.4))
    assert kept.ref.max_tokens_per_micro_batch == 4096
    assert [c.key for c in choices] == ["actor.max_tokens_per_micro_batch", "rollout.cudagraph_max_tokens"]


def test_a_budget_is_capped_by_the_ranks_mini_batch(body):
    small_batch = [f"model.path={body}", *JOB, "data.train_batch_size=2", "actor.ppo_mini_batch_size=2",
                   "rollout.sampling.n=2", "rollout.sampling.max_new_tokens=64"]
    chosen, choices = choose(load_config("grpo", small_batch), read_spec(body), MemoryPlanOptions(gpu_memory_gib=140.4))
    assert chosen.actor.max_tokens_per_micro_batch == 4 * (64 + 64)  # 2 prompts x 2 samples, all in one micro-batch
    assert "mini-batch" in choices[0].reason


def test_without_a_gpu_the_fallback_budget_and_preflight_applies_the_choice(body, tmp_path):
    cfg = load_config("grpo", [f"model.path={body}", *JOB])
    chosen, choices = choose(cfg, read_spec(body), None)
    assert {c.value for c in choices} == {default_token_budget(SEQ)} == {4 * SEQ}  # no CUDA-graph choice either
    assert "no GPU to plan for" in choices[0].reason
    # a plan built without preflight falls back the same way; fixed rows stay rows
    assert build_plan(cfg).actor.max_tokens_per_micro_batch == 4 * SEQ
    rows = build_plan(load_config("grpo", [f"model.path={body}", *JOB, "actor.micro_batch_size=8"]))
    assert rows.actor.micro_batch_size == 8 and rows.actor.max_tokens_per_micro_batch is None
    # preflight on a planned GPU puts the planner's budgets into the engines of plan.yaml
    from verl_mp.planner import choose_for_run

    on_gpu = choose_for_run(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, gpu_memory_gib=140.4)),
                              read_spec(body))
    want = choose(cfg, read_spec(body), MemoryPlanOptions(gpu_memory_gib=140.4))[0]
    assert build_plan(on_gpu).actor.max_tokens_per_micro_batch == want.actor.max_tokens_per_micro_batch > 4 * SEQ


def test_verl_mp_plan_prints_the_choices_with_reasons(body, capsys):
    from verl_mp.cli import main as cli_main

    rc = cli_main(["plan", "--config-name", "grpo", "--gpu-memory-gib", "140.4", f"model.path={body}", *JOB])
    out = capsys.readouterr().out
    assert rc == 0
    assert "settings chosen for this run" in out
    assert "actor.max_tokens_per_micro_batch=16384: token-budget micro-batches" in out and "the cap for actor" in out
    assert "rollout.sleep_level=2: a dense model" in out and "rollout.gpu_memory_utilization=0.4" in out


@pytest.mark.parametrize("extra, want", [
    ([], 1024),  # 256 x 8 samples on one engine: vLLM decodes 1024 at once, its graphs stop at 512
    (["data.train_batch_size=32", "actor.ppo_mini_batch_size=32"], 0),  # 256 sequences: vLLM's own sizes do
    (["data.train_batch_size=64", "actor.ppo_mini_batch_size=64", "rollout.multi_turn.enable=true",
      "rollout.multi_turn.tools=[calculator]"], 512 + 256),  # the next turns' prefill beside 512 decodes
    (["trainer.nproc=2", "data.train_batch_size=160", "actor.ppo_mini_batch_size=160"], 640),  # 1280 over 2 engines
    (["rollout.cudagraph_max_tokens=600"], 600),  # the run's own setting is kept
    (["data.train_batch_size=48", "actor.ppo_mini_batch_size=48", "rollout.backend=sglang"], 384),  # SGLang's own: 256
    (["data.train_batch_size=48", "actor.ppo_mini_batch_size=48", "rollout.backend=hf"], None),  # no CUDA graphs
    (["rollout.enforce_eager=true"], None),  # eager: no graphs to size
    (["actor.router_replay=rollout"], None),  # the hooks' routing capture runs vLLM eagerly
    (["actor.router_replay=rollout", "rollout.routing_capture=vllm"], 1024),  # vLLM's own capture keeps graphs
    (["trainer.gpu_memory_gib=40"], 0),  # under 70 GiB vLLM decodes 256 sequences at once: its own 512 do
])
def test_rollout_cuda_graph_range_covers_the_steps_one_engine_runs(body, extra, want):
    cfg = load_config("grpo", [f"model.path={body}", *JOB, *extra])
    gib = cfg.trainer.gpu_memory_gib or 140.4
    chosen, choices = choose(cfg, read_spec(body), MemoryPlanOptions(gpu_memory_gib=gib))
    assert chosen.rollout.cudagraph_max_tokens == want
    picked = [c for c in choices if c.key == "rollout.cudagraph_max_tokens"]
    if "rollout.cudagraph_max_tokens=600" in extra or want is None:
        assert not picked
    else:
        assert [c.value for c in picked] == [want] and "sequences per engine" in picked[0].reason
    assert build_plan(chosen).rollout.cudagraph_max_tokens == want  # what the rollout engines are told
    assert cfg.rollout.cudagraph_max_tokens == (600 if "rollout.cudagraph_max_tokens=600" in extra else None)


MT = ["data.train_batch_size=64", "actor.ppo_mini_batch_size=64", "rollout.multi_turn.enable=true",
      "rollout.multi_turn.tools=[calculator]"]


@pytest.mark.parametrize("extra, gib, want", [
    (MT, 140.4, 16),  # a GPU with CUDA graphs: new turns join together (MULTI_TURN_ADMIT_EVERY)
    ([*MT, "rollout.multi_turn.admit_every_steps=4"], 140.4, 4),  # the run's own setting is kept
    ([*MT, "rollout.enforce_eager=true"], 140.4, None),  # eager: no full graph to keep, each joins at once (1)
    (MT, None, None),  # no GPU to plan for (a CPU run): 1
    ([], 140.4, None),  # single-turn: nothing to admit
])
def test_multi_turn_admission_interval(body, extra, gib, want, capsys):
    cfg = load_config("grpo", [f"model.path={body}", *JOB, *extra])
    chosen, choices = choose(cfg, read_spec(body), MemoryPlanOptions(gpu_memory_gib=gib) if gib else None)
    mt = chosen.rollout.multi_turn
    assert mt.admit_every_steps == want and mt.admit_interval == (want or 1)
    picked = [c for c in choices if c.key == "rollout.multi_turn.admit_every_steps"]
    chose = want is not None and "rollout.multi_turn.admit_every_steps=4" not in extra
    assert [c.value for c in picked] == ([want] if chose else [])
    assert build_plan(chosen).rollout.multi_turn.admit_interval == (want or 1)  # what the turn loop is told
    if gib and extra:  # `verl-mp plan` says what the run gets and why
        from verl_mp.cli import main as cli_main

        assert cli_main(["plan", "--config-name", "grpo", "--gpu-memory-gib", str(gib), f"model.path={body}",
                         *JOB, *extra]) == 0
        out = capsys.readouterr().out
        line = next(l for l in out.splitlines() if "rollout.multi_turn.admit_every_steps=" in l)
        assert line.strip().startswith(f"rollout.multi_turn.admit_every_steps={want or 1}:")
        assert ("set by the run" in line) == ("rollout.multi_turn.admit_every_steps=4" in extra)


@pytest.mark.parametrize("enforce_eager, record_routing, capture, cuda, backend, eager", [
    (None, False, "hooks", True, "vllm", False),  # compiled on a GPU
    (None, False, "hooks", False, "vllm", True),  # eager on CPU
    (False, False, "hooks", False, "vllm", False),  # the run's own setting
    (True, False, "hooks", True, "vllm", True),
    (None, True, "hooks", True, "vllm", True),  # the hooks record each position outside graphs
    (False, True, "hooks", True, "vllm", True),  # ... whatever enforce_eager says
    (None, True, "vllm", True, "vllm", False),  # vLLM's own capture runs with graphs
    (None, True, "hooks", True, "sglang", False),  # no hooks outside vLLM
])
def test_runs_eager_is_the_one_rule_for_the_engine_and_the_planner(enforce_eager, record_routing, capture, cuda,
                                                                     backend, eager):
    from verl_mp.config.rollout import RolloutConfig

    cfg = RolloutConfig(enforce_eager=enforce_eager, routing_capture=capture, backend=backend)
    assert cfg.runs_eager(record_routing, cuda=cuda) is eager
