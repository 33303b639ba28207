"""launch/slurm.sbatch picks its rendezvous port on the head node instead of the fixed 29500.

Runs the real script with stand-ins for ``scontrol`` and ``srun`` (the ``srun`` stand-in
records its arguments): the prepare step writes config.yaml, and torchrun is given
``<head>:<port>`` with a port that was free. Before this change the port was always 29500.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_slurm_script_picks_a_free_port(inputs, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir / "scontrol", "echo head-node; sleep 0.2; echo other-node")  # late line: no SIGPIPE
    stub(bin_dir / "srun", f'printf "%s\\n" "$@" > {tmp_path}/srun_args')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=sys.executable, GPUS_PER_NODE="2",
               SLURM_JOB_NODELIST="head-node,other-node", SLURM_JOB_NUM_NODES="1", SLURM_JOB_ID="42")
    env.pop("PORT", None)
    out = tmp_path / "run"
    proc = subprocess.run(["bash", str(ROOT / "launch" / "slurm.sbatch"), "--config-name", "grpo", *inputs,
                           f"trainer.default_local_dir={out}"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = (tmp_path / "srun_args").read_text().splitlines()
    endpoint = args[args.index("--rdzv-endpoint") + 1]
    host, port = endpoint.split(":")
    assert host == "head-node" and port.isdigit() and int(port) != 29500 and 1024 < int(port) < 65536
    assert args[-2:] == ["--config", str(out / "config.yaml")] and (out / "config.yaml").is_file()
