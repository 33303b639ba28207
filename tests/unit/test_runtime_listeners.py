"""The process-group store this project serves itself listens on one address, not on all.

A world of one (no torchrun variables) and a 2-rank group started the way Ray actors start
(RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no torchrun agent): rank 0's listening sockets are
all on 127.0.0.1, and the group works. Against the code before this change rank 0's store
listened on the wildcard address (``::``/``0.0.0.0``) and these tests failed.
"""

import json
import os
import subprocess
import sys

import pytest

from verl_mp.utils import net

pytestmark = pytest.mark.unit

RANK_PROG = """
import json, os, psutil, torch, torch.distributed as dist
from verl_mp.engine.runtime import init_distributed
init_distributed(timeout_minutes=1)
x = torch.ones(1)
dist.all_reduce(x)
listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="tcp") if c.status == "LISTEN"})
print(json.dumps({"rank": dist.get_rank(), "sum": x.item(), "listening": listening}))
dist.destroy_process_group()
"""


def run_ranks(envs):
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                             "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE")}
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROG], env={**base, **env, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_stores_listen_on_loopback_only():
    """Both cases in one launch (the processes start in parallel: their imports dominate)."""
    port = net.free_port("127.0.0.1")
    env = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    alone, rank0, rank1 = run_ranks([{}, {**env, "RANK": "0", "LOCAL_RANK": "0"},
                                     {**env, "RANK": "1", "LOCAL_RANK": "1"}])
    assert alone["sum"] == 1.0 and [rank0["sum"], rank1["sum"]] == [2.0, 2.0]
    assert alone["listening"] and set(alone["listening"]) == {"127.0.0.1"}, alone
    assert rank0["listening"] and set(rank0["listening"]) == {"127.0.0.1"}, rank0


def test_reserved_port_stays_held_until_the_store_takes_it():
    import socket

    port = net.reserve_port("127.0.0.1")
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # nobody else can take it in the meantime
    assert net.is_loopback("127.0.0.1") and net.is_loopback("::1") and not net.is_loopback("10.0.0.1")
    with pytest.raises(ValueError, match="wildcard"):
        net.bind_address("0.0.0.0")
    net._RESERVED.pop(port).close()
