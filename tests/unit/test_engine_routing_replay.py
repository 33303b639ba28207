"""Routing replay's pure parts: a batch's per-position routing reaches the routers in their
token order (padded and packed micro-batches, sequence-parallel slices) and comes back; a
router forced onto given experts uses them with their scores, and routes naturally where told
to; the batch packs each sample's routing at its positions."""

import pytest
import torch

from verl_mp.data.rl_batch import RLBatch
from verl_mp.engine import batching
from verl_mp.engine.routing_replay import LayerReplay, from_router_order, to_router_order

pytestmark = pytest.mark.unit

L, K = 3, 2


def _micro_batch(packed: bool, pad_to: int = 1):
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])  # left/right padding
    ids = torch.arange(15).reshape(3, 5) * mask
    routing = torch.randint(0, 8, (3, 5, L, K), generator=torch.Generator().manual_seed(0)).to(torch.int16)
    routing[mask == 0] = -1
    starts, lengths = batching.row_spans(mask)
    mb = batching.build_micro_batch(ids, starts, lengths, [0, 1, 2], packed=packed, pad_to=pad_to,
                                    extra={"routed_experts": routing})
    return mb, routing, mask


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_router_order_round_trip(packed):
    mb, routing, mask = _micro_batch(packed, pad_to=2)
    aligned = mb.tensors["routed_experts"]
    halves = [to_router_order(mb, aligned, (rank, 2)) for rank in range(2)]  # two SP ranks
    ordered = torch.cat(halves, dim=1)  # what the TP all-gather of their recordings gives
    rows, width = mb.model_inputs["input_ids"].shape
    assert ordered.shape == (L, rows * width, K)
    back = from_router_order(mb, ordered)
    assert torch.equal(back[mb.valid], aligned[mb.valid])
    # the real tokens' routing, in order, is what the routers see (row-major tokens for packed,
    # sequence-major [s, b] for padded); padding is -1
    seq_major = ordered.permute(1, 0, 2)
    real = seq_major[(seq_major >= 0).all(-1).all(-1)]
    assert real.shape[0] == int(mask.sum())
    if packed:
        assert torch.equal(real, routing[mask.bool()].permute(0, 1, 2))


def test_forced_rows_use_the_given_experts_and_their_scores():
    scores = torch.tensor([[0.1, 0.5, 0.3, 0.9], [0.8, 0.2, 0.7, 0.1]])

    def natural(s, k, num_groups=None, group_topk=None):
        return torch.topk(s, k, dim=1)

    replay = LayerReplay()
    replay.target = torch.tensor([[0, 2], [-1, -1]], dtype=torch.int16)
    replay.record = True
    probs, idx = replay.get_replay_topk(scores, 2, default_compute_topk=natural)
    assert idx.tolist() == [[0, 2], [0, 2]]  # row 1 routes naturally (its top-2 is 0, 2)
    assert torch.equal(probs, scores.gather(1, idx))
    replay.target = torch.tensor([[3, 1], [1, 3]], dtype=torch.int16)
    probs, idx = replay.get_replay_topk(scores, 2, default_compute_topk=natural)
    assert idx.tolist() == [[3, 1], [1, 3]] and torch.equal(probs, torch.tensor([[0.9, 0.5], [0.2, 0.1]]))
    assert [r.tolist() for r in replay.recorded] == [[[0, 2], [0, 2]], [[3, 1], [1, 3]]]


def test_batch_packs_each_samples_routing_at_its_positions():
    batch = RLBatch.from_samples([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], 1, 0, ["", ""], ["", ""])
    per_sample = [torch.full((5, L, K), 1, dtype=torch.int16), torch.full((4, L, K), 2, dtype=torch.int16)]
    per_sample[0][-1] = -1
    batch.set_routing(per_sample)
    assert batch.routed_experts.shape == (2, 5, L, K)
    assert batch.routed_experts[0, :4].eq(1).all() and batch.routed_experts[0, 4].eq(-1).all()
    assert batch.routed_experts[1, :4].eq(2).all() and batch.routed_experts[1, 4].eq(-1).all()
    assert batch.select([1]).routed_experts.shape == (1, 5, L, K)
    with pytest.raises(ValueError, match="routing of 4 positions for 5 tokens"):
        batch.set_routing([per_sample[1], per_sample[1]])


def test_forced_probabilities_carry_the_gradient_of_their_scores():
    """A replayed router still learns: the forced experts' probabilities are the scores at
    those experts, with their gradient (d sum(probs) / d scores is 1 at the forced experts,
    0 elsewhere). Shown to fail with ``scores.gather(1, indices).detach()`` in
    `LayerReplay.get_replay_topk` (the forward and the recorded routing are unchanged)."""
    scores = torch.tensor([[0.1, 0.5, 0.3, 0.9], [0.8, 0.2, 0.7, 0.1]], requires_grad=True)

    def natural(s, k, num_groups=None, group_topk=None):
        return torch.topk(s, k, dim=1)

    replay = LayerReplay()
    replay.target = torch.tensor([[3, 1], [1, 3]], dtype=torch.int16)
    probs, idx = replay.get_replay_topk(scores, 2, default_compute_topk=natural)
    (probs * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert scores.grad.tolist() == [[0.0, 2.0, 0.0, 1.0], [0.0, 3.0, 0.0, 4.0]]
