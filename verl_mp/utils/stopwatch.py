"""Where a worker phase's seconds go: named parts, and the Python garbage collector.

A phase such as ``generate`` is more than the engine call (waking vLLM's memory, putting it
back to sleep); `PhaseParts` times each part so that ``timing/generate_s`` can be compared
with vLLM alone part by part. On a GPU each part ends with a device synchronisation, so
that its time includes the kernels it queued (otherwise they would be billed to the next
part). `gc_seconds` sums the collector's pauses inside a block: vLLM's scheduler runs in the
training process, whose heap a full collection has to walk.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseParts:
    """Seconds of named parts of one phase, as metrics ``timing/<phase>_<part>_s``."""

    def __init__(self, phase: str):
        self.phase = phase
        self.seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block, its queued device work included (GPU)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing/{self.phase}_{name}_s": s for name, s in self.seconds.items()}


@contextmanager
def gc_seconds(into: dict[str, float], key: str, full_key: str) -> Iterator[None]:
    """Add the seconds the garbage collector ran inside the block to ``into[key]``, and how
    many collections of the oldest generation it made to ``into[full_key]``."""
    started: list[float] = []
    total = [0.0, 0]

    def callback(event: str, info: dict) -> None:
        if event == "start":
            started.append(time.perf_counter())
        elif started:
            total[0] += time.perf_counter() - started.pop()
            total[1] += info.get("generation") == 2

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)
        into[key] = into.get(key, 0.0) + total[0]
        into[full_key] = into.get(full_key, 0.0) + total[1]
