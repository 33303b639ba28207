"""Engine-side pure pieces: micro-batch planning/alignment/packing and log-prob math (one rank)."""

import pytest
import torch

from verl_mp.engine.batching import (
    build_micro_batch,
    dummy_like,
    pad_model_inputs,
    plan_micro_batches,
    row_spans,
    scatter_rows,
)
from verl_mp.engine.logprobs import vocab_parallel_log_probs
from verl_mp.engine.moe import summarise

pytestmark = pytest.mark.unit

MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
IDS = torch.arange(1, 21).reshape(4, 5) * MASK


def test_row_spans_and_bad_masks():
    starts, lengths = row_spans(MASK)
    assert starts.tolist() == [2, 0, 0, 1] and lengths.tolist() == [3, 3, 5, 2]
    with pytest.raises(ValueError, match="contiguous"):
        row_spans(torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="without tokens"):
        row_spans(torch.tensor([[0, 0, 0]]))


def test_plans_by_count_and_by_token_budget():
    assert plan_micro_batches([3, 3, 5, 2], micro_batch_size=3, max_tokens=None, packed=False) == [[0, 1, 2], [3]]
    padded = plan_micro_batches([3, 3, 5, 2], micro_batch_size=None, max_tokens=6, packed=False)
    packed = plan_micro_batches([3, 3, 5, 2], micro_batch_size=None, max_tokens=6, packed=True)
    assert padded == [[2], [0, 1], [3]] and packed == [[2], [0, 1], [3]]
    assert plan_micro_batches([3, 3, 5, 2], micro_batch_size=None, max_tokens=8, packed=True) == [[2, 0], [1, 3]]
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=4"):
        plan_micro_batches([3, 5], micro_batch_size=None, max_tokens=4, packed=False)


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batch_alignment_targets_and_scatter_back(packed):
    starts, lengths = row_spans(MASK)
    extra = {"adv": IDS.float() * 10, "row_score": torch.tensor([1.0, 2, 3, 4])}
    mb = build_micro_batch(IDS, starts, lengths, [0, 3], packed=packed, pad_to=4, extra=extra)
    assert mb.tensors["adv"].tolist()[0][:3] == [30.0, 40.0, 50.0]
    assert mb.tensors["row_score"].tolist() == [1.0, 4.0]
    if packed:
        assert mb.model_inputs["input_ids"].tolist() == [[3, 4, 5, 17, 18, 0, 0, 0]]
        assert mb.targets.tolist() == [[4, 5, 0, 18, 0, 0, 0, 0]]
        assert mb.model_inputs["packed_seq_params"].cu_seqlens_q.tolist() == [0, 3, 5, 8]
    else:
        assert mb.model_inputs["input_ids"].tolist() == [[3, 4, 5, 0], [17, 18, 0, 0]]
        assert mb.targets.tolist() == [[4, 5, 0, 0], [18, 0, 0, 0]]
    # per-token values in the model layout -> aligned -> original columns
    aligned = mb.unpack(mb.model_inputs["input_ids"].float(), next_token=True)
    out = torch.zeros(4, 5)
    scatter_rows(out, mb, aligned)
    assert out.tolist()[0] == [0, 0, 3, 4, 0] and out.tolist()[3] == [0, 17, 0, 0, 0]


def test_log_probs_entropy_and_padded_vocab_on_one_rank():
    g = torch.Generator().manual_seed(0)
    vocab, padded = 11, 16
    logits = torch.randn(2, 5, padded, generator=g, requires_grad=True)
    logits_pad = logits.detach().clone()
    logits_pad[..., vocab:] = 1e4  # padded rows must not matter at all
    targets = torch.randint(0, vocab, (2, 5), generator=g)
    lp, ent = vocab_parallel_log_probs(logits, targets, vocab_size=vocab, temperature=0.5, with_entropy=True)
    lp_pad, _ = vocab_parallel_log_probs(logits_pad, targets, vocab_size=vocab, temperature=0.5)
    ref = torch.log_softmax(logits[..., :vocab].detach() / 0.5, dim=-1)
    assert torch.allclose(lp, ref.gather(-1, targets[..., None])[..., 0], atol=1e-6)
    assert torch.allclose(lp_pad, lp, atol=1e-6)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[..., vocab:].abs().max() == 0


@pytest.mark.parametrize("packed", [False, True])
def test_pad_model_inputs_keeps_real_tokens_and_crops_back(packed):
    """MoE token exchange pads micro-batches to a common shape: real tokens keep their place,
    the mask marks them, and crop() returns the unpadded model output."""
    starts, lengths = row_spans(MASK)
    mb = build_micro_batch(IDS, starts, lengths, [0, 3], packed=packed)
    rows, width = (1, 9) if packed else (3, 6)
    big = pad_model_inputs(mb, rows, width)
    ids, small = big.model_inputs["input_ids"], mb.model_inputs["input_ids"]
    assert tuple(ids.shape) == (rows, width) and torch.equal(ids[: small.shape[0], : small.shape[1]], small)
    keep = big.model_token_mask()
    assert int(keep.sum()) == 5 and torch.equal(keep[: small.shape[0], : small.shape[1]], mb.model_token_mask())
    output = torch.randn(rows, width, 7)
    assert torch.equal(big.crop(output), output[: small.shape[0], : small.shape[1]])
    if packed:  # the padding is one more THD sequence: no real token attends to it
        assert big.model_inputs["packed_seq_params"].cu_seqlens_q.tolist() == [0, 3, 5, 9]
    assert dummy_like(big).dummy and not big.dummy
    with pytest.raises(ValueError, match="cannot pad"):
        pad_model_inputs(mb, 1, 1)


def test_routing_metric_summary_by_hand():
    # 2 layers, 2 experts, top-1, 4 tokens: layer 0 balanced, layer 1 all on expert 0
    counts = torch.tensor([[2.0, 2.0], [4.0, 0.0]])
    probs = torch.tensor([[2.0, 2.0], [3.0, 1.0]])
    m = summarise(counts, probs, torch.tensor([4.0, 4.0]), top_k=1)
    # E * sum_i f_i P_i: layer 0 = 2 * (0.5*0.5 + 0.5*0.5) = 1; layer 1 = 2 * (1 * 0.75) = 1.5
    assert m["moe/load_balancing_loss"] == pytest.approx(1.25)
    assert m["moe/tokens_per_expert_max"] == 4 and m["moe/tokens_per_expert_mean"] == 2
    assert m["moe/max_over_mean_load"] == 2 and m["moe/dropped_tokens"] == 0
    dropped = summarise(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 2.0]]), torch.tensor([4.0]), top_k=1)
    assert dropped["moe/dropped_tokens"] == 1
