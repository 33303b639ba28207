"""rollout.multi_turn: typed settings, the checks preflight runs before any process starts, the
chat-template fragments of tool responses, and the batch a multi-turn sample becomes."""

import re

import pytest
import torch

from verl_mp.cli import main as cli_main
from verl_mp.config.rollout import MultiTurnConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.chat_fragments import ToolResponseFormat
from verl_mp.demo.tokenizer import build_tiny_tokenizer
from verl_mp.rollout.types import RolloutOutput
from verl_mp.trainer.steps import build_batch

pytestmark = pytest.mark.unit

MT = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_total_tokens=128"]
CASES = [
    ("HF backend", ["rollout.backend=hf"], r"rollout.multi_turn.enable=true needs rollout.backend=vllm"),
    ("longer than the engine", ["rollout.multi_turn.max_total_tokens=256"],
     r"rollout.multi_turn.max_total_tokens=256 exceeds rollout.max_model_len=128"),
    ("no room for a response", ["rollout.multi_turn.max_total_tokens=64"],
     r"data.max_prompt_length=64 leaves no room for a response in rollout.multi_turn.max_total_tokens=64"),
    ("unknown tool", ["rollout.multi_turn.tools=[abacus]"], r"rollout.multi_turn.tools: unknown tool 'abacus'; built-ins: "
                                                            r"\['calculator', 'python'\]"),
    ("tool plugin missing", ["rollout.multi_turn.tools=[x=no_such_pkg.mod:fn]"],
     r"rollout.multi_turn.tools: entry 'x=no_such_pkg.mod:fn': cannot import module 'no_such_pkg.mod'"),
    ("unknown parser", ["rollout.multi_turn.tool_parser=xml"], r"rollout.multi_turn.tool_parser='xml' is not a tool-call "
                                                               r"parser; valid: \['hermes'\]"),
    ("no tools", ["rollout.multi_turn.tools=[]"], r"rollout.multi_turn.enable=true needs at least one tool"),
    ("zero turns", ["rollout.multi_turn.max_turns=0"], r"rollout.multi_turn.max_turns=0 must be >= 1"),
    ("zero admit interval", ["rollout.multi_turn.admit_every_steps=0"],
     r"rollout.multi_turn.admit_every_steps=0 must be >= 1, or null for the planner's choice"),
    ("bad timeout", ["rollout.multi_turn.tool_timeout_s=0"], r"rollout.multi_turn.tool_timeout_s=0.0 must be > 0"),
    ("carry pool of one batch", ["rollout.multi_turn.carry_over=true", "rollout.multi_turn.carry_pool=1.0"],
     r"rollout.multi_turn.carry_pool=1.0 must be > 1"),
    ("carry tool steps", ["rollout.multi_turn.carry_over=true", "rollout.multi_turn.carry_tool_steps=0"],
     r"rollout.multi_turn.carry_tool_steps=0 must be >= 1"),
    ("carry two steps ahead", ["rollout.multi_turn.carry_over=true", "trainer.off_policy_steps=2",
                               "trainer.placement.pools.gen=[1]", "trainer.placement.roles.rollout=gen",
                               "trainer.nproc=1", "trainer.launcher=ray"],
     r"rollout.multi_turn.carry_over=true with trainer.off_policy_steps=2: .* set trainer.off_policy_steps to 0 or 1"),
]


@pytest.mark.parametrize("case,overrides,message", CASES, ids=[c[0] for c in CASES])
def test_preflight_refuses(inputs, nothing_starts, capsys, case, overrides, message):
    rc = cli_main(["train", "--config-name", "grpo", *inputs, *MT, *overrides])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc == 2 and re.search(message, err), err


def test_preflight_accepts_a_multi_turn_run(inputs, nothing_starts, tmp_path):
    """--prepare-only runs preflight and writes the plan; the multi-turn settings reach it."""
    import yaml

    rc = cli_main(["train", "--config-name", "grpo", "--prepare-only", *inputs, *MT,
                   f"trainer.default_local_dir={tmp_path}", "rollout.multi_turn.tools=[calculator,python]"])
    assert rc == 0
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["rollout"]["multi_turn"]["enable"] is True
    assert plan["rollout"]["multi_turn"]["tools"] == ["calculator", "python"]


def test_fragments_cut_from_the_template():
    """The ids after an assistant turn: the template's text around the tool contents, its own
    copy of the EOS left out when the model stopped at EOS; several responses in one go."""
    tok = build_tiny_tokenizer()
    fmt = ToolResponseFormat(tok)
    result = fmt.content_ids("303688")
    after_eos = fmt.encode([result], after_eos=True)
    assert tok.decode(after_eos) == "\n<|im_start|>tool\n303688<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.encode([result], after_eos=False) == [tok.eos_token_id] + after_eos
    two = fmt.encode([result, fmt.content_ids("7")], after_eos=True)
    assert tok.decode(two) == ("\n<|im_start|>tool\n303688<|im_end|>\n<|im_start|>tool\n7<|im_end|>\n"
                               "<|im_start|>assistant\n")
    # what the template renders for the whole conversation, token for token after the model's turn
    messages = [{"role": "user", "content": "What is 374*812?"}, {"role": "assistant", "content": "X"},
                {"role": "tool", "content": "303688"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith(tok.decode(after_eos)) and text.split("X", 1)[1] == "<|im_end|>" + tok.decode(after_eos)


GROUPING_TEMPLATE = (  # Qwen2.5-style: consecutive tool messages share one user turn
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_fragments_of_a_template_that_groups_tool_responses():
    tok = build_tiny_tokenizer()
    tok.chat_template = GROUPING_TEMPLATE
    fmt = ToolResponseFormat(tok)
    ids = fmt.encode([fmt.content_ids("1"), fmt.content_ids("2")], after_eos=True)
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n"
                               "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_fragments_refuse_a_template_without_tool_messages():
    tok = build_tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] != 'tool' %}{{ '<|im_start|>' + m['role'] + '\\n' "
                         "+ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}")
    with pytest.raises(ValueError, match="rollout.multi_turn.tool_role"):
        ToolResponseFormat(tok)


def test_config_defaults_are_off_and_valid():
    cfg = MultiTurnConfig()
    assert not cfg.enable and cfg.tools == ["calculator"] and cfg.tool_parser == "hermes"
    with pytest.raises(ValueError, match="rollout.multi_turn.tool_memory_limit_mb=0"):
        MultiTurnConfig(tool_memory_limit_mb=0)


def test_batch_masks_tool_tokens():
    """A multi-turn sample becomes one row: the mask is 1 exactly on the model's tokens, the
    rollout log-probs are kept there and 0 elsewhere, the reward lands on the last model token."""
    from verl_mp.reward.manager import token_level_rewards

    response = [11, 12, 2, 50, 51, 52, 21, 2]
    mask = [1, 1, 1, 0, 0, 0, 1, 1]
    lps = [-0.1, -0.2, -0.3, 0.0, 0.0, 0.0, -0.4, -0.5]
    out = RolloutOutput(prompt_ids=[[1, 2, 3]], response_ids=[response, [7, 2]], response_logprobs=[lps, [-1.0, -2.0]],
                        n=2, finished=[True, True], response_masks=[mask, [1, 1]],
                        trajectories=[{"messages": [{"role": "assistant", "content": "a"}]}] * 2)
    prompts = PromptBatch(input_ids=[[1, 2, 3]], prompts=["p"], ground_truths=["g"], data_sources=["s"], indices=[0])
    batch = build_batch(prompts, out, pad_token_id=0)
    assert batch.input_ids[0].tolist() == [1, 2, 3] + response
    assert batch.response_mask.tolist() == [mask, [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.rollout_log_probs[0].tolist() == pytest.approx(lps)
    rewards = token_level_rewards(torch.tensor([1.0, 2.0]), batch.response_mask)
    assert rewards[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1.0] and rewards[1, 1] == 2.0
    with pytest.raises(ValueError, match="one mask entry per response token"):
        RolloutOutput(prompt_ids=[[1]], response_ids=[[1, 2]], response_logprobs=None, n=1, finished=[True],
                      response_masks=[[1]])


def test_dynamic_sampling_keeps_masks_and_trajectories():
    """Groups picked and joined by dynamic sampling carry their samples' masks and trajectories
    (dropping them would train on the tool responses' tokens)."""
    from verl_mp.trainer.dynamic_sampling import ScoredSamples, fill_groups

    def samples(tag, scores):
        out = RolloutOutput(prompt_ids=[[1], [2]], response_ids=[[5, 6, 7]] * 4, response_logprobs=None, n=2,
                            finished=[True] * 4, response_masks=[[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 0]],
                            trajectories=[{"tag": f"{tag}{i}"} for i in range(4)])
        prompts = PromptBatch(input_ids=[[1], [2]], prompts=["a", "b"], ground_truths=["", ""], data_sources=["", ""],
                              indices=[0, 1])
        return ScoredSamples(prompts, out, torch.tensor(scores), torch.zeros(4, dtype=torch.int64), {})

    first = samples("x", [1.0, 1.0, 0.0, 1.0])  # group 0 flat, group 1 informative
    chosen, _ = fill_groups(first, lambda r: samples("y", [0.0, 1.0, 1.0, 1.0]), target_groups=2, max_extra_rounds=1)
    assert [t["tag"] for t in chosen.out.trajectories] == ["x2", "x3", "y0", "y1"]
    assert chosen.out.response_masks == [[0, 1, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0]]


def test_agentic_doc_names_real_metrics_and_keys():
    """docs/agentic.md: every ``rollout/multi_turn/*`` metric it names is one the rollout writes,
    and every ``rollout.multi_turn.*`` key it names is in the schema."""
    from pathlib import Path

    from verl_mp.rollout.multi_turn import merge_metrics

    text = (Path(__file__).resolve().parents[2] / "docs" / "agentic.md").read_text()
    written = set(merge_metrics([{"wall_s": 1.0}]))
    table = text.split("Metrics (`rollout/multi_turn/*`", 1)[1].split("Validation logs", 1)[0]
    named = {f"rollout/multi_turn/{m}" for m in re.findall(r"`([a-z_]+)`", table)}
    named |= set(re.findall(r"`(rollout/multi_turn/[a-z_]+)`", text))
    assert named and named <= written, sorted(named - written)
    fields = set(MultiTurnConfig.__dataclass_fields__)
    keys = set(re.findall(r"rollout\.multi_turn\.([a-z_]+)", text))
    keys |= set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    keys |= {k.strip("` ") for row in re.findall(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)+) \|", text, re.M)
             for k in row.split(",")}
    assert keys and keys <= fields, sorted(keys - fields)


def test_prefix_cache_share_counts_the_continuation_turns_only():
    """``engine_prefix_cached_frac``: the first turn's prompt (the dataset's, shared by the
    sample's siblings) is not counted; each continuation's prompt tokens and cache hits are."""
    from verl_mp.config.rollout import SamplingConfig
    from verl_mp.reward.tool_parser import ToolCall
    from verl_mp.reward.tool_pool import ToolPool
    from verl_mp.rollout.multi_turn import Conversation, MultiTurnState, TurnOutput, merge_metrics

    tok = build_tiny_tokenizer()
    calls_abacus = lambda text: [ToolCall("abacus", {})]  # noqa: E731  (unknown: answered without a tool worker)
    conv = Conversation(0, [5, 6, 7])
    state = MultiTurnState(MultiTurnConfig(enable=True, tools=["calculator"], max_turns=3, max_total_tokens=512),
                           SamplingConfig(max_new_tokens=8), tok, ToolResponseFormat(tok), {}, calls_abacus,
                           ToolPool(1, 1.0), [conv])  # never started: no call reaches a worker
    first, _ = state.next_requests(engine_busy=False)
    state.on_outputs([TurnOutput(first[0].request_id, [9, 10], None, True, prompt_tokens=3, cached_tokens=3)])
    second, _ = state.next_requests(engine_busy=False)
    assert second[0].prompt_ids == conv.prompt + conv.ids  # the conversation so far
    state.on_outputs([TurnOutput(second[0].request_id, [11], None, True, prompt_tokens=len(second[0].prompt_ids),
                                 cached_tokens=16)])
    third, _ = state.next_requests(engine_busy=False)
    state.on_outputs([TurnOutput(third[0].request_id, [12], None, False, prompt_tokens=len(third[0].prompt_ids),
                                 cached_tokens=32)])
    m = merge_metrics([state.metrics()])
    want = (16 + 32) / (len(second[0].prompt_ids) + len(third[0].prompt_ids))
    assert m["rollout/multi_turn/engine_prefix_cached_frac"] == pytest.approx(want)
    assert m["rollout/multi_turn/turns"] == 3 and m["rollout/multi_turn/unknown_tools"] == 2
    # every finished turn's computed prompt tokens, the first turn's included (it was fully cached here)
    computed = (len(second[0].prompt_ids) - 16) + (len(third[0].prompt_ids) - 32)
    assert m["rollout/multi_turn/engine_prefilled_tokens"] == computed
    assert m["rollout/multi_turn/engine_prefilled_per_model_token"] == pytest.approx(computed / 4)  # 2 + 1 + 1


def test_batch_turn_metrics_count_whole_conversations():
    """`batch_turn_metrics` (carry-over's turns and tool calls per conversation) agrees with the
    counters when every conversation ran in this generation (malformed and unknown calls, a
    turn at max_turns, two calls in one turn), and counts a carried conversation's earlier
    turns where the counters count only this generation's."""
    from verl_mp.config.rollout import SamplingConfig
    from verl_mp.reward.tool_parser import ToolCall
    from verl_mp.reward.tool_pool import ToolPool
    from verl_mp.rollout.multi_turn import Conversation, MultiTurnState, TurnOutput, merge_metrics
    from verl_mp.rollout.vllm_turns import batch_turn_metrics

    tok = build_tiny_tokenizer()

    def parser(text):  # no worker is ever needed: unknown tools and malformed calls are answered at once
        return [ToolCall("abacus", {}), ToolCall("", {}, error="bad json")]

    def state_of(convs):
        return MultiTurnState(MultiTurnConfig(enable=True, tools=["calculator"], max_turns=3, max_total_tokens=512),
                              SamplingConfig(max_new_tokens=8), tok, ToolResponseFormat(tok), {}, parser,
                              ToolPool(1, 1.0), convs)  # never started

    def run(convs):
        state = state_of(convs)
        while True:
            requests, _ = state.next_requests(engine_busy=False)
            if not requests:
                break
            state.on_outputs([TurnOutput(r.request_id, [9, 10], None, True) for r in requests])
        assert all(c.done for c in convs)
        return merge_metrics([state.metrics()]), batch_turn_metrics([c.trajectory() for c in convs])

    counters, batch = run([Conversation(0, [5, 6, 7]), Conversation(1, [5, 6])])
    assert counters["rollout/multi_turn/turns_per_conversation"] == 3  # the third turn's calls hit max_turns
    assert counters["rollout/multi_turn/tool_calls_per_conversation"] == 4  # 2 turns x 2 calls
    for key, value in batch.items():
        assert counters[key] == value, (key, counters[key], value)

    # a conversation carried in after 2 turns (and their 4 calls): this generation runs its third turn only
    first = Conversation(0, [5, 6, 7])
    state = state_of([first])
    for _ in range(2):
        requests, _ = state.next_requests(engine_busy=False)
        state.on_outputs([TurnOutput(requests[0].request_id, [9, 10], None, True)])
    carried = Conversation.from_state(0, first.prompt, first.state())
    assert carried.turns == 2 and not carried.done
    counters, batch = run([carried])
    assert counters["rollout/multi_turn/turns_per_conversation"] == 1
    assert counters["rollout/multi_turn/tool_calls_per_conversation"] == 0
    assert batch == {"rollout/multi_turn/turns_per_conversation": 3.0,
                     "rollout/multi_turn/tool_calls_per_conversation": 4.0}
    assert batch_turn_metrics([]) == {}
