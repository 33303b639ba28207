"""ResumableBatchSampler: seeding, epochs, drop_last and exact resume."""

import pytest

from verl_mp.data.sampler import ResumableBatchSampler

pytestmark = pytest.mark.unit


def take(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_resume_reproduces_uninterrupted_run():
    reference = take(ResumableBatchSampler(23, 4, seed=7), 20)  # crosses several epochs
    first = ResumableBatchSampler(23, 4, seed=7)
    head = take(first, 8)
    state = first.state_dict()
    resumed = ResumableBatchSampler(23, 4, seed=7)
    resumed.load_state_dict(state)
    assert head + take(resumed, 12) == reference


def test_resume_with_for_loop_iteration():
    def run(stop_after=None):
        sampler, seen = ResumableBatchSampler(10, 3, seed=1), []
        for _ in range(3):
            for batch in sampler:
                seen.append(batch)
                if len(seen) == stop_after:
                    return seen, sampler.state_dict()
        return seen, None

    full, _ = run()
    head, state = run(stop_after=4)
    sampler = ResumableBatchSampler(10, 3, seed=1)
    sampler.load_state_dict(state)
    tail = []
    while sampler.epoch < 3:  # the same 3-epoch loop, continued mid-epoch
        tail.extend(sampler)
    assert head + tail == full


def test_epochs_are_permutations_and_differ():
    sampler = ResumableBatchSampler(12, 4, seed=3)
    epoch0, epoch1 = list(sampler), list(sampler)
    assert sorted(i for b in epoch0 for i in b) == list(range(12))
    assert epoch0 != epoch1 and sampler.epoch == 2
    assert list(ResumableBatchSampler(12, 4, seed=3)) == epoch0
    assert list(ResumableBatchSampler(12, 4, seed=4)) != epoch0


def test_drop_last_and_no_shuffle():
    assert len(ResumableBatchSampler(10, 4)) == 2
    sampler = ResumableBatchSampler(10, 4, shuffle=False, drop_last=False)
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match="cannot fill one batch"):
        ResumableBatchSampler(3, 4)


def test_load_rejects_changed_dataset():
    state = ResumableBatchSampler(10, 2).state_dict()
    with pytest.raises(ValueError, match="num_samples=10"):
        ResumableBatchSampler(11, 2).load_state_dict(state)
