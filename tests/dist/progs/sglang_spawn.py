"""For tests/dist/test_sglang_weights.py: under torchrun (1 rank), start a process the way
SGLang starts its schedulers (``spawn``) and let it form its own one-member ``tcp://`` process
group, as SGLang's scheduler does at start-up: once with the rank's environment as torchrun
made it, once inside ``sglang_rollout.engine_start_env()``. Writes JSON to argv[1]: each
child's exit code and torchrun's agent-store variable after the ``with`` block."""

import datetime
import json
import multiprocessing as mp
import os
import socket
import sys

from verl_mp.rollout.sglang_rollout import engine_start_env


def own_group(timeout_s: float) -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0,
                            timeout=datetime.timedelta(seconds=timeout_s))
    dist.destroy_process_group()


def run_child(timeout_s: float) -> int:
    p = mp.get_context("spawn").Process(target=own_group, args=(timeout_s,))
    p.start()
    p.join(timeout_s + 60)
    return p.exitcode


def main() -> None:
    r = {"agent_store_in_rank": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}
    r["plain_exit"] = run_child(4.0)
    with engine_start_env():
        r["inside_exit"] = run_child(30.0)
    r["agent_store_after"] = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
    with open(sys.argv[1], "w") as f:
        json.dump(r, f)


if __name__ == "__main__":
    main()
