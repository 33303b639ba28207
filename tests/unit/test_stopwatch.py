"""Phase parts and the garbage collector's time (`verl_mp.utils.stopwatch`)."""

import gc
import time

from verl_mp.utils.stopwatch import PhaseParts, gc_seconds


def test_parts_add_up_per_name():
    parts = PhaseParts("generate")
    for _ in range(2):
        with parts.part("wake"):
            time.sleep(0.01)
    with parts.part("engine"):
        pass
    m = parts.metrics()
    assert set(m) == {"timing/generate_wake_s", "timing/generate_engine_s"}
    assert 0.02 <= m["timing/generate_wake_s"] < 1.0
    assert 0.0 <= m["timing/generate_engine_s"] < m["timing/generate_wake_s"]


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
