"""What ``rollout.backend=sglang`` hands to ``Engine.update_weights_from_tensor``, at one (TP, PP)
layout, for tests/dist/test_sglang_weights.py (no SGLang here: it runs on CUDA only).

The ``gather`` sync's stream cut into batches (`verl_mp.rollout.sglang_rollout.weight_batches`,
0.1 MiB: several batches), every batch held until the whole stream is consumed (as the
rollout holds one batch while the next is produced): the named tensors of all batches must
equal the HF checkpoint's tensors, bit for bit, each name once; every batch but the last
reaches the batch size. Writes JSON per architecture and rank.
"""

import argparse
import json

import torch
import torch.distributed as dist

from verl_mp.bridge.weight_sync import WeightSync
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import destroy_parallel
from verl_mp.rollout.sglang_rollout import weight_batches

BATCH_BYTES = int(0.1 * 2**20)


def load_checkpoint_tensors(path: str) -> dict[str, torch.Tensor]:
    from pathlib import Path

    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def check(path: str, parallel: ParallelConfig) -> dict:
    engine = MegatronEngine(EngineConfig(model_path=path, role="ref", parallel=parallel, micro_batch_size=2))
    engine.load_hf()
    sync = WeightSync(engine.spec, engine.chunks, engine.state, 0.05, "gather")
    batches = list(weight_batches(sync.iter_weights(), BATCH_BYTES))  # all held to the end
    names = [n for b in batches for n, _ in b]
    got = {n: t for b in batches for n, t in b}
    want = load_checkpoint_tensors(path)
    sizes = [sum(t.numel() * t.element_size() for _, t in b) for b in batches]
    return {
        "num_batches": len(batches),
        "names_once": len(names) == len(set(names)),
        "names_equal": sorted(got) == sorted(want),
        "missing": sorted(set(want) - set(got))[:5], "extra": sorted(set(got) - set(want))[:5],
        "bit_equal": all(n in got and got[n].dtype == want[n].dtype and torch.equal(got[n], want[n]) for n in want),
        "full_batches": all(s >= BATCH_BYTES for s in sizes[:-1]),
        "bytes": sum(sizes),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--archs", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    results = {}
    for arch in a.archs.split(","):
        parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp)
        row = check(f"{a.models}/{arch}", parallel)  # starts the process group
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        results[arch] = rows
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    destroy_parallel()


if __name__ == "__main__":
    main()
