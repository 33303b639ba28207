"""The local Ray a run starts requires its own token, and writes no token file.

`verl_mp.trainer.run._init_ray` (the only thing started here; one Ray start; the refused
connection makes one attempt instead of Ray's 20, one a second): Ray's processes run with
token authentication and a per-run token from the environment; ``~/.ray/auth_token`` is not
created; a driver with a wrong token is refused for its token, one with the run's token
connects. Before this change Ray's default generated a
token into ``~/.ray/auth_token`` (shared by every run of the user, mode 0644) and the first
assertion failed.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

PROG = """
import json, os, subprocess, sys
from types import SimpleNamespace
import ray
from verl_mp.trainer.run import _init_ray

_init_ray(None, SimpleNamespace(groups={'g': SimpleNamespace(world_size=1)}), verbose=False)

@ray.remote
def worker_env():
    return os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN") == token

token = os.environ["RAY_AUTH_TOKEN"]
gcs = ray.get_runtime_context().gcs_address
connect = "import ray; ray.init(address=%r, log_to_driver=False); print('connected')" % gcs
joined, auth_refused = {}, {}
# One connection attempt for the wrong token (Ray retries a refused one once a second for ~20 s):
# RAY_gcs_server_port_wait_time_s is the number of attempts a connecting driver makes.
for name, value, attempts in (("wrong", "0" * 64, "1"), ("right", token, "20")):
    env = dict(os.environ, RAY_AUTH_TOKEN=value, RAY_gcs_server_port_wait_time_s=attempts)
    proc = subprocess.run([sys.executable, "-c", connect], env=env, capture_output=True, text=True, timeout=150)
    joined[name] = proc.returncode == 0 and "connected" in proc.stdout
    auth_refused[name] = "InvalidAuthToken" in proc.stderr
print(json.dumps({"mode": os.environ["RAY_AUTH_MODE"], "worker": ray.get(worker_env.remote()), "joined": joined,
                  "auth_refused": auth_refused,
                  "token_file": os.path.exists(os.path.expanduser("~/.ray/auth_token"))}))
ray.shutdown()
"""


def test_local_ray_uses_a_per_run_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", PROG], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["token_file"] is False
    assert result["mode"] == "token" and result["worker"] == ["token", True]
    assert result["joined"] == {"wrong": False, "right": True}
    assert result["auth_refused"] == {"wrong": True, "right": False}  # refused for its token, not for anything else
