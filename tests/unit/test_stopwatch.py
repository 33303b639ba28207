"""Phase parts and the garbage collector's time (`verl_mp.utils.stopwatch`)."""

import gc
import time

import pytest

from verl_mp.utils.stopwatch import PhaseParts, gc_seconds

pytestmark = pytest.mark.unit


def test_parts_add_up_per_name():
    """A part's time is the sum of its blocks: at least the sleeps in them, at most the time
    measured around them (bounds from the test's own clock, not from a guess of how loaded
    the machine is: a fixed upper bound such as 1 s could fail on a busy 2-core runner)."""
    parts = PhaseParts("generate")
    start = time.perf_counter()
    for _ in range(2):
        with parts.part("wake"):
            time.sleep(0.01)
    wake_outer = time.perf_counter() - start
    start = time.perf_counter()
    with parts.part("engine"):
        pass
    engine_outer = time.perf_counter() - start
    m = parts.metrics()
    assert set(m) == {"timing/generate_wake_s", "timing/generate_engine_s"}
    assert 0.02 <= m["timing/generate_wake_s"] <= wake_outer
    assert 0.0 <= m["timing/generate_engine_s"] <= engine_outer


def test_part_is_recorded_when_the_block_raises():
    parts = PhaseParts("weight_sync")
    try:
        with parts.part("load"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "timing/weight_sync_load_s" in parts.metrics()


def test_gc_seconds_counts_collections_in_the_block_only():
    out: dict[str, float] = {}
    gc.collect()  # outside: not counted
    with gc_seconds(out, "gc_s", "full"):
        garbage = [[] for _ in range(10_000)]
        for a, b in zip(garbage[:-1], garbage[1:], strict=True):
            a.append(b)
            b.append(a)  # cycles only a collection frees
        del garbage, a, b
        gc.collect()
        gc.collect()
    assert out["full"] >= 2
    assert out["gc_s"] > 0.0
    before = dict(out)
    gc.collect()  # the callback is gone after the block
    assert out == before
    with gc_seconds(out, "gc_s", "full"):  # accumulates
        gc.collect()
    assert out["full"] >= 3 and out["gc_s"] >= before["gc_s"]
