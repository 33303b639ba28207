"""A second `verl-mp train` on a directory another live run holds is refused before it writes
anything there; once the holder is gone (killed), the directory is free again. Before this
change the second run overwrote config.yaml and went on."""

import signal
import subprocess
import sys

import pytest

from verl_mp.cli import main as cli_main

pytestmark = pytest.mark.unit

HOLDER = """
import sys, time
from verl_mp.utils.fs import DirLock
DirLock(sys.argv[1], purpose="a verl_mp run").acquire()
print("holding", flush=True)
time.sleep(120)
"""


def test_second_run_on_a_held_directory_is_refused(inputs, nothing_starts, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--config-name", "grpo", *inputs, f"trainer.default_local_dir={out}", "--prepare-only"]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert cli_main(["train", *args]) == 2
        err = capsys.readouterr().err
        assert f"{out} is in use by a verl_mp run (pid {holder.pid} " in err and "trainer.default_local_dir" in err
        assert not (out / "config.yaml").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stdout.close()
    assert cli_main(["train", *args]) == 0 and (out / "config.yaml").is_file()
