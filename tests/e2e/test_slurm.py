"""SLURM for real: `sbatch` on a one-node cluster (scripts/install_slurm.sh) runs
launch/slurm.sbatch (torchrun, no Ray) and launch/ray_slurm.sbatch (a Ray cluster inside the
job), each training 2 GRPO steps of the tiny model (Megatron TP=2 + vLLM TP=2 on gloo).

The torchrun job runs two tasks on the one node, so the c10d rendezvous really has two
"nodes" (agents): each gets its own group rank and global ranks, from the node list and
rendezvous address the script derives. What one machine cannot show (two hosts, a shared
file system, GPUs per node) is explained in docs/multinode.md.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 600


def _slurm_ready() -> bool:
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return proc.returncode == 0 and any(s.startswith(("idle", "mixed")) for s in proc.stdout.split())


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not _slurm_ready(), reason="no running Slurm here: `sudo bash scripts/install_slurm.sh` "
                                                  "starts a one-node cluster (.ci/run does)"),
]


def sbatch(script: str, args: list[str], log: Path, env: dict, *options: str) -> None:
    """Submit, wait for the job's end, and fail with its log unless it exited 0.

    Not ``sbatch --wait``: it polls the job after 2, 10, 42, 74, ... s (its sleep grows 4x up
    to 32 s), so a job that ends after 43 s is seen at 74 s (both jobs here took 74 s that way,
    2026-12-06). `scontrol show job` every second sees the end within a second."""
    cmd = ["sbatch", "--parsable", f"--output={log}", f"--chdir={REPO}", *options,
           str(REPO / "launch" / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable, **env})
    assert proc.returncode == 0, f"sbatch {script} failed ({proc.returncode}): {proc.stderr}"
    job = proc.stdout.strip().split(";")[0]  # --parsable prints "<id>[;cluster]"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (state := _job_state(job))["JobState"] not in FINISHED:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job])
            raise TimeoutError(f"{script} (job {job}) did not end in {JOB_TIMEOUT_S} s")
        time.sleep(1)
    if state["JobState"] != "COMPLETED" or state["ExitCode"] != "0:0":
        text = log.read_text() if log.exists() else ""
        raise AssertionError(f"{script} failed ({state['JobState']}, exit {state['ExitCode']}):\n{text[-6000:]}")


FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}
"""Slurm's final job states (a finished job stays listed for MinJobAge, 300 s by default)."""


def _job_state(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def _rendezvous_results(text: str) -> dict[str, dict[str, str]]:
    """torchrun agents' "Rendezvous complete" results (LOGLEVEL=INFO), keyed by agent pid."""
    agents: dict[str, dict[str, str]] = {}
    for pid, key, value in re.findall(r"^\S+ \S+ (\d+) \S+api\.py:\d+\]\s+(\w+)=(\S+)$", text, re.M):
        agents.setdefault(pid, {})[key] = value
    return agents


def _steps(out_dir: Path) -> dict:
    return {r["step"]: r for r in read_jsonl(str(out_dir / "metrics.jsonl"))}


def _grpo_args(tiny_run_inputs, out: Path) -> list[str]:
    overrides = [o for o in base_overrides(tiny_run_inputs, out, "torchrun") if not o.startswith("trainer.launcher")]
    return ["--config-name", "grpo", *overrides, "actor.megatron.tensor_model_parallel_size=2",
            "rollout.tensor_model_parallel_size=2"]


def test_torchrun_sbatch_two_agents(tiny_run_inputs, tmp_path):
    out, log = tmp_path / "run", tmp_path / "job.log"
    sbatch("slurm.sbatch", _grpo_args(tiny_run_inputs, out), log, {"GPUS_PER_NODE": "1"}, "-N", "1",
           "--ntasks-per-node=2")
    text = log.read_text()
    head = re.search(r"nodes \[(\S+)\], 2 agents x 1 ranks, rendezvous (\S+):(\d+)", text)
    assert head and head.group(2) == head.group(1), text[:2000]
    # each agent joined the rendezvous as its own node, with its own node rank and global rank
    agents = _rendezvous_results(text)
    assert sorted((a["group_rank"], a["global_ranks"]) for a in agents.values()) == [("0", "[0]"), ("1", "[1]")]
    assert all(a["group_world_size"] == "2" and a["local_ranks"] == "[0]" for a in agents.values()), agents
    config = (out / "config.yaml").read_text()
    assert "nnodes: 2" in config and "nproc: 1" in config and "launcher: torchrun" in config
    steps = _steps(out)
    assert set(steps) >= {1, 2}
    assert all(steps[s]["rollout/logprob_diff_max"] < 1e-4 for s in (1, 2))


def test_ray_on_slurm(tiny_run_inputs, tmp_path):
    out, log = tmp_path / "run", tmp_path / "job.log"
    sbatch("ray_slurm.sbatch", _grpo_args(tiny_run_inputs, out), log, {"GPUS_PER_NODE": "2"}, "-N", "1")
    text = log.read_text()
    assert "1 Ray nodes up" in text
    assert "launcher: ray" in (out / "config.yaml").read_text()
    steps = _steps(out)
    assert set(steps) >= {1, 2}
    assert all(steps[s]["rollout/logprob_diff_max"] < 1e-4 for s in (1, 2))
    assert not list(Path("/tmp").glob(f"ray-{_job_id(text)}")), "the job's Ray temp dir was left behind"


def _job_id(text: str) -> str:
    return re.search(r"ray_slurm.sbatch: job (\d+)", text).group(1)
