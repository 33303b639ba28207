"""patches/vllm_sampled_logprobs.py without vLLM: how the recorded rows are cut per sample.
(Against vLLM's own log-probs: tests/dist/test_sampled_logprobs.py.)"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl_mp.patches import vllm_sampled_logprobs as vsl

pytestmark = pytest.mark.unit


def test_first_rows_skips_discarded_and_trailing_rows():
    # rows of 4 steps; samples 0 and 1, and -1 for a request of no sample
    keys = np.array([0, 1, -1, 0, 1, 0, 1, 1, 0])
    kept = np.array([0, 1, 1, 1, 1, 1, 1, 1, 1], dtype=bool)  # row 0: an unfinished prefill chunk
    # sample 0: rows 3, 5 then 8 (one step more after it stopped); sample 1: rows 1, 4, 6, 7
    assert vsl.first_rows(keys, kept, np.array([2, 4])).tolist() == [3, 5, 1, 4, 6, 7]
    assert vsl.first_rows(keys, kept, np.array([0, 1])).tolist() == [1]
    with pytest.raises(RuntimeError, match="sample 0 has 4 tokens but 3 recorded rows"):
        vsl.first_rows(keys, kept, np.array([4, 1]))


def _output(request_id, samples):
    return SimpleNamespace(request_id=request_id,
                           outputs=[SimpleNamespace(index=i, token_ids=t) for i, t in enumerate(samples)])


def _step(cap, ids, kept, lps, toks):
    cap.pending = (torch.tensor(lps, dtype=torch.float32), torch.tensor(toks, dtype=torch.int32))
    cap.record(ids, np.array(kept, dtype=bool))


def test_capture_cuts_the_steps_per_sample_and_checks_the_tokens():
    cap = vsl.Capture()
    cap.samples = {"0_a-x": ("a", 0), "1_a-x": ("a", 1), "b-y": ("b", 0)}
    _step(cap, ["0_a-x", "1_a-x", "b-y"], [1, 1, 0], [-0.5, -1.5, -9.0], [5, 6, 0])
    _step(cap, ["0_a-x", "1_a-x", "b-y"], [1, 1, 1], [-0.25, -1.25, -2.0], [7, 8, 9])
    _step(cap, ["1_a-x", "b-y"], [1, 1], [-1.0, -3.0], [4, 3])
    outs = [_output("a", [[5, 7], [6, 8, 4]]), _output("b", [[9, 3]])]
    assert cap.steps[0][0] is cap.steps[1][0]  # an unchanged batch shares its id list
    assert cap.logprobs(outs) == [[[-0.5, -0.25], [-1.5, -1.25, -1.0]], [[-2.0, -3.0]]]
    outs[1].outputs[0].token_ids = [9, 4]
    with pytest.raises(RuntimeError, match="recorded tokens differ"):
        cap.logprobs(outs)
    assert vsl.Capture().logprobs([]) == []  # a data-parallel rank with no prompts


def test_one_capture_at_a_time():
    with vsl.capture() as cap:
        assert vsl._ACTIVE is cap
        with pytest.raises(RuntimeError, match="already open"), vsl.capture():
            pass
    assert vsl._ACTIVE is None
