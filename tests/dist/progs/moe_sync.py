"""The weight sync of mixture-of-experts models at one megatron layout, without vLLM, for
tests/dist/test_rollout_sync_moe.py.

For every tiny MoE architecture (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral):

- ``gather``: with buckets far smaller than the model (many buckets, every EP rank's experts
  broadcast inside the EP group), the full HF tensors equal the (untrained) checkpoint's, bit
  for bit, on every rank, and no rank held more than a bucket (or the one tensor larger than
  it) plus one gathered tensor; with ``--dtype bf16``, the checkpoint's tensors rounded to bf16,
  but those HF keeps in fp32 (DeepSeek-V3's routing bias) in fp32, bit for bit;
- ``local`` (unless ``--vllm none``): against the vLLM expert layout the rank would have
  (``--vllm ep``: vLLM expert parallelism, each rank whole experts of its block; ``--vllm tp``:
  vLLM TP = expert-TP, every expert sliced), every tensor equals an independent slicing of the full HF tensors by vLLM's rules
  (``w13[slot] = [gate rows of r; up rows of r]``, ``w2[slot]`` = down's columns of r; the
  dense tensors as in local_sync.py), and `planned_shapes` equals what is yielded and matches
  the fused parameters' shapes.
"""

import argparse
import json

import torch
import torch.distributed as dist
from local_sync import expected_vllm_shards, load_checkpoint_tensors

from verl_mp.bridge.expert_layout import expert_of, megatron_experts
from verl_mp.bridge.weight_sync import WeightSync, _shape_mismatch
from verl_mp.config.parallel import ParallelConfig
from verl_mp.demo.tiny_models import TINY_MOE_MODELS
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import destroy_parallel
from verl_mp.models.registry import FP32_HF_TENSORS
from verl_mp.rollout.types import ExpertLayout, expert_slot

_PREFIX = {"MixtralForCausalLM": "block_sparse_moe"}
_HF_EXPERT = {"MixtralForCausalLM": ("w1", "w3", "w2")}


def vllm_layout(spec, state, vllm_ep: bool) -> ExpertLayout:
    """What vLLM 0.32 holds on this rank (names as in vLLM 0.32)."""
    mlp = _PREFIX.get(spec.architecture, "mlp")
    names = {i: f"model.layers.{i}.{mlp}.experts.routed_experts" for i in range(spec.num_layers)}
    if vllm_ep:
        experts = megatron_experts(spec.moe.num_experts, state.ep_rank, state.ep_size)
        tp_size, tp_rank = 1, 0
    else:
        experts, tp_size, tp_rank = tuple(range(spec.moe.num_experts)), state.tp_size, state.tp_rank
    return ExpertLayout(tp_size=tp_size, tp_rank=tp_rank, experts=experts,
                        w13={i: f"{n}.w13_weight" for i, n in names.items()},
                        w2={i: f"{n}.w2_weight" for i, n in names.items()})


def expected_experts(hf: dict, spec, layout: ExpertLayout) -> dict[str, torch.Tensor]:
    mlp = _PREFIX.get(spec.architecture, "mlp")
    gate, up, down = _HF_EXPERT.get(spec.architecture, ("gate_proj", "up_proj", "down_proj"))
    r, n = layout.tp_rank, spec.moe.ffn_hidden_size // layout.tp_size
    out = {}
    for i in range(spec.num_layers):
        for slot, e in enumerate(layout.experts):
            base = f"model.layers.{i}.{mlp}.experts.{e}."
            out[expert_slot(layout.w13[i], slot)] = torch.cat(
                [hf[base + gate + ".weight"][r * n:(r + 1) * n], hf[base + up + ".weight"][r * n:(r + 1) * n]])
            out[expert_slot(layout.w2[i], slot)] = hf[base + down + ".weight"][:, r * n:(r + 1) * n]
    return out


def fused_shapes(want: dict, layout: ExpertLayout) -> dict:
    """vLLM's parameter shapes: dense tensors as yielded, each fused parameter [slots, ...]."""
    shapes = {n: tuple(t.shape) for n, t in want.items() if "[" not in n}
    for names in (layout.w13, layout.w2):
        for name in names.values():
            shapes[name] = (len(layout.experts), *want[expert_slot(name, 0)].shape)
    return shapes


def check(path: str, parallel: ParallelConfig, vllm: str, dtype: str = "fp32") -> dict:
    engine = MegatronEngine(EngineConfig(model_path=path, role="ref", parallel=parallel, micro_batch_size=2,
                                         dtype=dtype))
    engine.load_hf()
    spec, state = engine.spec, engine.state
    original = load_checkpoint_tensors(path)  # fp32
    if dtype == "bf16":
        original = {n: t if n.endswith(FP32_HF_TENSORS) else t.to(torch.bfloat16) for n, t in original.items()}
    gather = WeightSync(spec, engine.chunks, state, 0.01, "gather")
    full = {n: t.clone() for n, t in gather.iter_weights()}
    g = gather.last_stats
    largest = max(i.param.numel() * i.param.element_size() * (state.etp_size if i.expert else state.tp_size)
                  for i in gather.infos if i.tp_dim is not None) if state.tp_size * state.etp_size > 1 else 0
    # a bucket holds at least one tensor, even one larger than the bucket size
    bucket = max([gather.bucket_bytes] + [e.numel * 4 for entries in gather.stage_entries for e in entries])
    row = {"gather_equals_checkpoint": sorted(full) == sorted(original)
           and all(full[n].dtype == original[n].dtype and torch.equal(full[n], original[n]) for n in original),
           "fp32_tensors": sorted(n for n, t in full.items() if t.dtype == torch.float32)[:3],
           "gather_buckets": g.num_buckets, "ep_broadcast_bytes": g.ep_broadcast_bytes,
           "etp_gathered_bytes": g.tp_gathered_bytes, "gather_peak_ok": g.peak_transient_bytes <= bucket + largest}
    if vllm == "none":
        return row
    layout = vllm_layout(spec, state, vllm == "ep")
    local = WeightSync(spec, engine.chunks, state, 0.01, "local", experts=layout)
    planned = local.planned_shapes()
    got = {n: t.clone() for n, t in local.iter_weights()}
    dense_hf = {n: t for n, t in full.items() if ".experts." not in n}
    want = {**expected_vllm_shards(dense_hf, spec, state.tp_rank, state.tp_size),
            **expected_experts(full, spec, layout)}
    direct = {}
    if local.copies_directly:  # in place into NaN-filled stand-ins of vLLM's (fused) parameters
        params = {n: torch.full(shape, float("nan")) for n, shape in fused_shapes(want, layout).items()}
        local.copy_into(params)
        written = dict(want)
        for name in list(written):
            if "[" in name:
                base, slot = name[:-1].rsplit("[", 1)
                written[name] = params[base][int(slot)]
            else:
                written[name] = params[name]
        direct["direct_max_abs_diff"] = max(float((written[n] - want[n]).abs().nan_to_num(nan=float("inf")).max())
                                            for n in want)
        direct["direct_all_written"] = all(not t.isnan().any() for t in params.values())
    return {
        **row, **direct,
        "names_equal": sorted(got) == sorted(want),
        "missing": sorted(set(want) - set(got))[:5], "extra": sorted(set(got) - set(want))[:5],
        "max_abs_diff": max((float((got[n] - want[n]).abs().max()) if got[n].shape == want[n].shape
                             else float("inf")) for n in want if n in got),
        "num_expert_slots": sum(1 for n in got if "[" in n),
        "planned_equal": planned == {n: tuple(t.shape) for n, t in got.items()},
        "shapes_match_vllm": _shape_mismatch(planned, fused_shapes(want, layout)),
        "experts_routed_here": sorted({expert_of(i.global_name)[1] for i in local.infos if i.expert}),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--kinds", default=",".join(TINY_MOE_MODELS), help="comma-separated tiny models (directories)")
    p.add_argument("--vllm", choices=("ep", "tp", "none"), default="none",
                   help="the vLLM expert layout to check the local mode against")
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    a = p.parse_args()
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, expert_model_parallel_size=a.ep,
                              expert_tensor_parallel_size=a.etp, pipeline_model_parallel_size=a.pp)
    results = {}
    for kind in a.kinds.split(","):
        row = check(f"{a.models}/{kind}", parallel, a.vllm, a.dtype)
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        results[kind] = rows
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
