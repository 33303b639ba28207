"""`peak_allocated_bytes` on CPU: every storage created inside the call counts until it is
freed, also when another thread frees it (gloo's workers do; the profiler's memory events
miss such frees and grow without bound: 30 gloo all-gathers of 128 KB read as 1.4-2.6 MB).
Exact byte counts for known allocation patterns."""

import threading

import pytest
import torch

from verl_mp.utils.memory import peak_allocated_bytes

pytestmark = pytest.mark.unit
MB = 1_000_000


def test_peak_of_overlapping_allocations():
    def work():
        a = torch.empty(MB, dtype=torch.uint8)
        b = torch.empty(2 * MB, dtype=torch.uint8)
        del a
        c = torch.empty(MB // 2, dtype=torch.uint8)
        del b, c

    assert peak_allocated_bytes(work) == 3 * MB


def test_only_memory_allocated_inside_counts():
    held = [torch.empty(4 * MB, dtype=torch.uint8)]

    def work():
        held.pop()  # freeing what was live before does not lower the peak below 0
        torch.empty(MB, dtype=torch.uint8)

    assert peak_allocated_bytes(work) == MB


def test_a_consumer_holding_the_last_item_keeps_two_generator_buffers_alive():
    """What a ``for`` loop over a bucketed generator costs: the loop variable still holds
    the previous bucket's view while the generator allocates the next bucket."""
    def buckets():
        for _ in range(3):
            flat = torch.empty(MB, dtype=torch.uint8)
            yield flat[:10]
            del flat

    def for_loop():
        for _view in buckets():
            pass

    assert peak_allocated_bytes(for_loop) == 2 * MB


def test_a_free_on_another_thread_counts():
    def work():
        a = [torch.empty(MB, dtype=torch.uint8)]
        worker = threading.Thread(target=a.clear)  # the last reference dies on the worker
        worker.start()
        worker.join()
        torch.empty(MB, dtype=torch.uint8)

    assert peak_allocated_bytes(work) == MB


def test_views_keep_their_storage_alive_and_in_place_ops_allocate_nothing():
    def work():
        base = torch.zeros(MB, dtype=torch.uint8)
        view = base[:10]
        del base
        view.add_(1)
        torch.empty(MB, dtype=torch.uint8)  # the first storage is still alive through the view

    assert peak_allocated_bytes(work) == 2 * MB
