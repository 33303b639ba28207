"""The ``local`` weight-sync mode at one (TP, PP) layout, for tests/dist/test_weight_sync_local.py.

For every tiny architecture: what the ``local`` sync yields on each rank (vLLM parameter
names, this TP rank's shards) must equal, bit for bit, an independent slicing of the full
HF tensors (from the ``gather`` sync) by vLLM's documented TP rules:

- ``qkv_proj``: ``[q rows of rank r; k rows of rank r; v rows of rank r]`` (heads split evenly);
- ``gate_up_proj``: ``[gate rows of r; up rows of r]``;
- ``o_proj`` / ``down_proj``: the input columns of rank r;
- ``embed_tokens`` / ``lm_head``: rows ``[r * R, (r + 1) * R)`` of the vocabulary zero-padded
  to a multiple of 64, ``R = padded / tp``;
- everything else whole.
The ``gather`` sync's full HF tensors themselves must equal the (untrained) checkpoint's,
bit for bit. Writes JSON: per architecture the largest difference, the tensor counts, the shapes
`planned_shapes` promised, and the sync's TP-gather bytes; with ``--memory-model``, the memory
both modes hold at most, measured on real tensors (`measured_peak`).
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
from verl_mp.utils.memory import peak_allocated_bytes

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
COLUMN_SPLIT = ("o_proj.weight", "down_proj.weight")


def expected_vllm_shards(hf: dict[str, torch.Tensor], spec, r: int, tp: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}

    def rows(t, parts):  # rank r's block of an evenly split first dimension
        n = t.shape[0] // parts
        return t[r * n:(r + 1) * n]

    for name, t in hf.items():
        leaf = name.rsplit(".", 2)
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            padded = -(-spec.vocab_size // 64) * 64
            full = torch.zeros((padded, t.shape[1]), dtype=t.dtype)
            full[: t.shape[0]] = t
            out[name] = rows(full, tp)
        elif leaf[-2] in ("q_proj", "k_proj", "v_proj"):
            fused = f"{leaf[0]}.qkv_proj.{leaf[-1]}"
            parts = [rows(hf[f"{leaf[0]}.{p}.{leaf[-1]}"], tp) for p in ("q_proj", "k_proj", "v_proj")]
            out[fused] = torch.cat(parts)
        elif leaf[-2] in ("gate_proj", "up_proj"):
            fused = f"{leaf[0]}.gate_up_proj.{leaf[-1]}"
            out[fused] = torch.cat([rows(hf[f"{leaf[0]}.{p}.{leaf[-1]}"], tp) for p in ("gate_proj", "up_proj")])
        elif name.endswith(COLUMN_SPLIT):
            n = t.shape[1] // tp
            out[name] = t[:, r * n:(r + 1) * n]
        else:
            out[name] = t
    return out


def load_checkpoint_tensors(path: str) -> dict[str, torch.Tensor]:
    from pathlib import Path

    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def measured_peak(sync: WeightSync) -> dict[str, int]:
    """One whole sync consumed as vLLM's loaders consume it (a ``for`` loop: the loop
    variable still holds the last tensor while the next one is produced): the most tensor
    bytes it held at once on PyTorch's allocator (`peak_allocated_bytes`), the sync's own
    count of the same, the bytes it moved, and the sizes the bound is made of."""
    def for_loop():
        for _name, _tensor in sync.iter_weights():
            pass

    measured = peak_allocated_bytes(for_loop)
    tp = sync.state.tp_size
    return {"measured": measured, "counted": sync.last_stats.peak_transient_bytes,
            "bytes_synced": sync.last_stats.bytes_synced, "bucket_bytes": sync.bucket_bytes,
            "largest_entry_bytes": max(e.numel * sync.dtype.itemsize for s in sync.stage_entries for e in s),
            "largest_gathered_bytes": max((i.param.numel() * i.param.element_size() * tp
                                           for i in sync.infos if sync._gathers(i)), default=0)}


def memory(path: str, parallel: ParallelConfig) -> dict[str, dict[str, int]]:
    """`measured_peak` of both sync modes on a model of many buckets (0.1 MiB each)."""
    engine = MegatronEngine(EngineConfig(model_path=path, role="ref", parallel=parallel, micro_batch_size=2))
    engine.load_hf()
    return {mode: measured_peak(WeightSync(engine.spec, engine.chunks, engine.state, 0.1, mode))
            for mode in ("local", "gather")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--models", required=True, help="folder with one tiny checkpoint per architecture")
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline chunks per stage")
    p.add_argument("--memory-model", default=None, help="a checkpoint of many buckets for the memory check")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    results = {}
    for arch in ARCHS:
        path = f"{a.models}/{arch}"
        parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                                  virtual_pipeline_model_parallel_size=a.vpp)
        engine = MegatronEngine(EngineConfig(model_path=path, role="ref", parallel=parallel, micro_batch_size=2))
        engine.load_hf()
        full = dict(WeightSync(engine.spec, engine.chunks, engine.state, 1, "gather").iter_weights())
        original = load_checkpoint_tensors(path)  # the model is untrained: the gather sync must equal it
        local_sync = WeightSync(engine.spec, engine.chunks, engine.state, 0.1, "local")  # several buckets
        planned = local_sync.planned_shapes()
        got = {n: t.clone() for n, t in local_sync.iter_weights()}
        state = engine.state
        want = expected_vllm_shards(full, engine.spec, state.tp_rank, state.tp_size)
        stats = local_sync.last_stats
        direct = {}
        if local_sync.copies_directly:  # the in-place copy into stand-ins of vLLM's parameters (NaN-filled)
            params = {n: torch.full(shape, float("nan"), dtype=got[n].dtype) for n, shape in planned.items()}
            local_sync.copy_into(params)
            direct["direct_max_abs_diff"] = max(float((params[n] - want[n]).abs().nan_to_num(nan=float("inf")).max())
                                                for n in want)  # an element never written stays NaN: inf
            direct["direct_bytes_synced"] = local_sync.last_stats.bytes_synced
            try:  # a vLLM parameter no shard writes would keep stale weights: refused, named
                local_sync.copy_into({**params, "model.extra.weight": torch.zeros(3)})
                direct["direct_refuses_unwritten"] = False
            except ValueError as e:
                direct["direct_refuses_unwritten"] = "model.extra.weight" in str(e)
            # the plan is reused and reads the live parameters: a change shows in the next copy
            param = next(i.param for i in local_sync.infos if i.global_name.endswith("final_layernorm.weight"))
            if param is not None:
                with torch.no_grad():
                    param.add_(1.0)
                local_sync.copy_into(params)
                name = "model.norm.weight"
                direct["direct_sees_update"] = bool(torch.equal(params[name], want[name] + 1.0))
                with torch.no_grad():
                    param.sub_(1.0)
        row = {**direct,
            "gather_equals_checkpoint": sorted(full) == sorted(original)
            and all(torch.equal(full[n], original[n]) for n in original),
            "names_equal": sorted(got) == sorted(want),
            "missing": sorted(set(want) - set(got))[:5], "extra": sorted(set(got) - set(want))[:5],
            "max_abs_diff": max((float((got[n] - want[n]).abs().max()) if got[n].shape == want[n].shape
                                 else float("inf")) for n in want if n in got),
            "planned_equal": planned == {n: tuple(t.shape) for n, t in got.items()},
            "vocab_multiple_of_64": engine.spec.vocab_size % 64 == 0,
            "tp_gathered_bytes": stats.tp_gathered_bytes,
            "num_tensors": len(got),
            "num_buckets": stats.num_buckets,
            "bytes_synced": stats.bytes_synced,
        }
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        results[arch] = rows
    if a.memory_model:
        parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                                  virtual_pipeline_model_parallel_size=a.vpp)
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, memory(a.memory_model, parallel))
        results["memory"] = rows
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
