"""`routing_for` and `routing_from_vllm`: a sampled sequence's routing from what the vLLM
worker recorded (the project's hooks, or vLLM's own capture).

A sequence is normally recorded without its last token (sampled, never run); after an extra
step of vLLM's async scheduling (on by default on GPUs) the whole sequence is. Both must be
found, with the right rows, and a sequence never recorded must fail naming what was recorded.
"""

import numpy as np
import pytest
import torch

from verl_mp.rollout.routing_capture import CAPTURE_DTYPE, routing_for, routing_from_vllm

pytestmark = pytest.mark.unit


def _routing(length: int, layers: int = 2, k: int = 2, start: int = 0) -> torch.Tensor:
    return (torch.arange(length * layers * k).reshape(length, layers, k) + start).to(CAPTURE_DTYPE)


def test_sequence_recorded_without_its_last_token():
    prompt, response = [5, 6, 7], [8, 9]
    recorded = _routing(4)
    out = routing_for({(5, 6, 7, 8): recorded}, prompt, response)
    assert out.shape == (5, 2, 2)
    assert torch.equal(out[:4], recorded) and bool((out[4] == -1).all())


def test_sequence_recorded_whole_after_an_async_scheduling_step():
    prompt, response = [5, 6, 7], [8, 9]
    recorded = _routing(5, start=100)
    out = routing_for({(5, 6, 7, 8, 9): recorded}, prompt, response)
    assert torch.equal(out, recorded)  # the last position ran: its routing is real


def test_the_shorter_record_wins_when_both_exist():
    # [5, 6, 7, 8] is this 5-token sequence's record and, whole, a 4-token sibling's
    short, whole = _routing(4), _routing(5, start=50)
    out = routing_for({(5, 6, 7, 8): short, (5, 6, 7, 8, 9): whole}, [5, 6, 7], [8, 9])
    assert torch.equal(out[:4], short)


def test_unrecorded_sequence_names_what_was_recorded():
    with pytest.raises(KeyError, match=r"2 requests recorded, those with this prompt ran \[4\] tokens"):
        routing_for({(5, 6, 7, 1): _routing(4), (9, 9): _routing(2)}, [5, 6, 7], [8, 9])


def test_routing_from_vllms_own_capture():
    # vLLM ran the 3 prompt tokens and the first 2 of 3 response tokens: 5 rows
    ran = np.arange(5 * 2 * 2, dtype=np.int32).reshape(5, 2, 2)
    out = routing_from_vllm(ran, 3, 3)
    assert out.dtype == CAPTURE_DTYPE and out.shape == (6, 2, 2)
    assert torch.equal(out[:5], torch.from_numpy(ran).to(CAPTURE_DTYPE)) and bool((out[5] == -1).all())


@pytest.mark.parametrize("routed,match", [(None, "no routed_experts"),
                                          (np.zeros((2, 2, 2), dtype=np.int32), r"shape \(2, 2, 2\)")])
def test_routing_from_vllm_refuses_what_does_not_fit(routed, match):
    with pytest.raises(ValueError, match=match):
        routing_from_vllm(routed, 3, 3)


def test_vllm_capture_is_refused_on_cpu():
    from verl_mp.config.rollout import RolloutConfig
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    with pytest.raises(ValueError, match="rollout.routing_capture=vllm needs CUDA"):
        VLLMRollout(RolloutConfig(routing_capture="vllm"), "unused", 1, moe=True, record_routing=True)
    with pytest.raises(ValueError, match="rollout.routing_capture='x' is not one of"):
        RolloutConfig(routing_capture="x")
