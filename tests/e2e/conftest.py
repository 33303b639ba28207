"""Shared fixtures for end-to-end runs of the real CLI: a tiny model and data set, and the
warm starts of the MoE and tool demos, built while the session's other tests run.

The demo tests run the embedded demos through the CLI from a cold cache in a fresh clone: the
warm starts are ~4 min of compute-bound supervised training on 2 cores, most of the demo
tests' time. The MoE and tool demos' warm starts are built by the real CLI (`verl-mp train
--config-name <preset> --prepare-only`, which prepares the demo and stops) in background
processes started as soon as the session knows it will run those tests; they run with one
torch thread each under SCHED_IDLE, so they are scheduled only on CPU time the tests leave
idle (the runs wait on start-ups, sleeps and each other much of the time). Not free: on the
2-vCPU CI machine the dist tests that ran beside them took ~12% longer (docs/testing.md). The demo tests then run the CLI on that cache and check that it reused
the warm start instead of building another. The dense demo (tests/e2e/test_demo.py) still
builds its warm start inside the CLI run it checks: its console checks (quiet, a heartbeat
every 15 s) cover the warm start, which shares its code (`verl_mp.demo.warm_start._build`)
with the MoE demo's and calls the tool demo's through the same hook.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

BACKGROUND_WARM_STARTS = {"test_demo_moe.py": "tiny_moe_cpu", "test_demo_tool.py": "tiny_tool_cpu"}
"""Test module -> the demo preset whose warm start is built in the background for it."""


@pytest.fixture(scope="session")
def tiny_run_inputs(tmp_path_factory):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    root = tmp_path_factory.mktemp("e2e_inputs")
    model = save_tiny_qwen2(root / "model")
    train, test = write_synthetic_dataset(root / "data", num_train=256, num_test=16, seed=0)
    return {"model": str(model), "train": str(train), "test": str(test)}


class _WarmStarts:
    """Background `--prepare-only` runs, one per preset, into one cache."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="verl_mp-demo-warm-starts-"))
        given = os.environ.get("VERL_MP_CACHE")  # a cache of the user's: reused, filled if cold
        self.cache = Path(given) if given else self.root / "cache"
        self.procs: dict[str, tuple[subprocess.Popen, Path, float]] = {}

    def start(self, preset: str, background: bool = True) -> None:
        if preset in self.procs:
            return
        log = self.root / f"{preset}.log"
        cmd = [sys.executable, "-m", "verl_mp", "train", "--config-name", preset, "--prepare-only",
               f"trainer.default_local_dir={self.root / ('prepare-' + preset)}"]
        env = {**os.environ, "VERL_MP_CACHE": str(self.cache)}
        if background:  # one thread: two threads sharing a busy core run a step ~10x slower
            env["OMP_NUM_THREADS"] = "1"
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_idle_priority if background else None)
        self.procs[preset] = (proc, log, time.monotonic())

    def wait(self, preset: str, timeout_s: float = 1200) -> Path:
        """The cache holding ``preset``'s warm start, once its build has finished."""
        self.start(preset, background=False)  # not started (the test was not collected with the session)
        proc, log, started = self.procs[preset]
        waited = time.monotonic()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{preset}'s warm start did not finish in {timeout_s} s:\n{log.read_text()[-3000:]}")
        assert rc == 0, f"{preset}'s warm start failed ({rc}):\n{log.read_text()[-6000:]}"
        print(f"{preset}: warm start built in the background, {time.monotonic() - started:.0f} s after its "
              f"start; the test waited {time.monotonic() - waited:.0f} s for it")
        return self.cache

    def close(self) -> None:
        for proc, _, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _idle_priority() -> None:
    """In the child before exec: run only on CPU time nothing else wants (SCHED_IDLE)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


_warm_starts: _WarmStarts | None = None


def _builder() -> _WarmStarts:
    global _warm_starts
    if _warm_starts is None:
        _warm_starts = _WarmStarts()
    return _warm_starts


def pytest_collection_finish(session):
    """Start the warm starts of the demo tests this session will run (none in the fast set)."""
    selected = {Path(str(item.fspath)).name for item in session.items}
    for module, preset in BACKGROUND_WARM_STARTS.items():
        if module in selected:
            _builder().start(preset)


def pytest_sessionfinish(session):
    if _warm_starts is not None:
        _warm_starts.close()


@pytest.fixture
def demo_warm_start():
    """``demo_warm_start(preset)``: the cache (a VERL_MP_CACHE) holding that demo's warm start,
    built by the CLI in the background (see the module doc)."""
    return _builder().wait
