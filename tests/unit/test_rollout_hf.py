"""The HF fallback rollout backend (no vLLM): the log-probs it returns are the model's own
(teacher-forced HF forward, fp32, within 1e-5), sampling is reproducible by seed, and
`load_weights` takes HF-named tensors and refuses anything else by name."""

import pytest
import torch

from verl_mp.config.rollout import RolloutConfig, SamplingConfig
from verl_mp.demo.tiny_models import save_tiny_qwen2
from verl_mp.rollout.hf_rollout import HFRollout

pytestmark = pytest.mark.unit

PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    return HFRollout(RolloutConfig(backend="hf"), str(save_tiny_qwen2(tmp_path_factory.mktemp("hf") / "m")))


def teacher_forced(model, prompt, response, temperature):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_log_probs_are_the_models(rollout):
    sampling = SamplingConfig(n=2, temperature=0.7, max_new_tokens=6, seed=3)
    out = rollout.generate(PROMPTS, sampling)
    assert len(out.response_ids) == len(PROMPTS) * 2
    for i, (resp, lps) in enumerate(zip(out.response_ids, out.response_logprobs, strict=True)):
        ref = teacher_forced(rollout.model, PROMPTS[i // 2], resp, 0.7)
        assert torch.allclose(torch.tensor(lps), ref, atol=1e-5), (i, lps, ref.tolist())


def test_seeded_sampling_repeats_and_greedy_is_argmax(rollout):
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=6, seed=11)
    assert rollout.generate(PROMPTS, sampling).response_ids == rollout.generate(PROMPTS, sampling).response_ids
    greedy = rollout.generate(PROMPTS[:1], SamplingConfig(n=1, temperature=0.0, max_new_tokens=1))
    with torch.no_grad():
        first = int(rollout.model(torch.tensor([PROMPTS[0]])).logits[0, -1].argmax())
    assert greedy.response_ids[0][0] == first


def test_load_weights(rollout):
    name, param = next(iter(rollout.model.named_parameters()))
    before = param.detach().clone()
    rollout.load_weights([(name, before + 1.0)])
    assert torch.equal(param.detach(), before + 1.0)
    rollout.load_weights([(name, before)])
    with pytest.raises(KeyError, match="'model.no_such.weight' is not a parameter"):
        rollout.load_weights([("model.no_such.weight", before)])
    with pytest.raises(ValueError, match="weight_sync_mode=gather"):
        rollout.load_weights([], kernel_format=True)


def test_ignore_eos_generates_to_max_new_tokens(rollout):
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=5)
    first = rollout.generate(PROMPTS[:1], greedy).response_ids[0][0]
    saved = rollout.eos_ids
    rollout.eos_ids = {first}  # the greedy first token is now EOS: generation stops at once...
    try:
        stopped = rollout.generate(PROMPTS[:1], greedy)
        assert stopped.response_ids[0] == [first] and stopped.finished == [True]
        # ...unless EOS is ignored; an explicit stop token still stops
        full = rollout.generate(PROMPTS[:1], SamplingConfig(n=1, temperature=0.0, max_new_tokens=5, ignore_eos=True))
        assert len(full.response_ids[0]) == 5 and full.response_ids[0][0] == first and full.finished == [False]
        stop = SamplingConfig(n=1, temperature=0.0, max_new_tokens=5, ignore_eos=True, stop_token_ids=[first])
        assert rollout.generate(PROMPTS[:1], stop).response_ids[0] == [first]
    finally:
        rollout.eos_ids = saved
