"""Bytes that one megatron transformer layer (the engine's sdpa layer spec) saves for
backward, counted by autograd's saved-tensor hooks, for tests/dist/test_planner_activations.py.

For each case (TP, SP, dtype, recompute, q/k norm, kernels: the torch ops or the fused
Triton ones of the GPU path, ``VERL_MP_KERNELS``) a GPTModel chunk with 1 and with 2
layers runs one training-mode forward; the difference of the distinct storages saved
(parameters excluded) is one layer's share. With ``--grads`` the fp32 cases also run a
backward and report how far the gradients are from the same model without recompute.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine import model as engine_model
from verl_mp.engine.runtime import destroy_parallel, initialize_parallel
from verl_mp.kernels import ENV_VAR
from verl_mp.models.spec import GPTSpec

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=704, vocab_size=1000,
             add_qkv_bias=True, tie_word_embeddings=True, kv_channels=64)
ROWS, SEQ = 2, 64
CASES = {
    "tp1": dict(tp=1),
    "tp1_fp32": dict(tp=1, dtype="fp32"),
    "tp1_qk_norm": dict(tp=1, qk_norm=True),
    "tp1_selective_mlp": dict(tp=1, recompute="selective", modules=["mlp"]),
    "tp1_selective_core_attn": dict(tp=1, recompute="selective", modules=["core_attn"]),
    "tp1_full": dict(tp=1, recompute="full"),
    "tp2": dict(tp=2),
    "tp2_sp": dict(tp=2, sp=True),
    "tp2_sp_full": dict(tp=2, sp=True, recompute="full"),
    # the GPU kernel path (VERL_MP_KERNELS=triton; here Triton's CPU interpreter): fused RMSNorm and SwiGLU
    "tp1_kernels": dict(tp=1, kernels="triton"),
    "tp2_sp_kernels": dict(tp=2, sp=True, kernels="triton"),
    "tp1_qk_norm_kernels": dict(tp=1, qk_norm=True, kernels="triton"),
}


def build(case: dict, num_layers: int, dtype: str):
    spec = GPTSpec(num_layers=num_layers, qk_layernorm=case.get("qk_norm", False), **SHAPE)
    parallel = ParallelConfig(tensor_model_parallel_size=case["tp"], sequence_parallel=case.get("sp", False))
    state = initialize_parallel(parallel)
    torch.manual_seed(0)
    recompute = engine_model.recompute_settings(case.get("recompute") or "none", case.get("modules", ["mlp"]))
    # as MegatronEngine builds it for the sdpa backend (the MLP's activation is the SwiGLU module)
    config = engine_model.transformer_config(spec, parallel, dtype, swiglu_module=True, **recompute)
    chunk = engine_model.build_gpt_chunks(spec, config, state, backend="sdpa")[0]
    chunk.train()
    return chunk


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (ROWS, SEQ), generator=g)
    return ids, torch.arange(SEQ).expand(ROWS, SEQ)


def saved_bytes(chunk) -> int:
    """Bytes of the distinct storages autograd saves in one forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in chunk.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    ids, pos = inputs()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunk(ids, pos, None)
    return sum(seen.values())


def grads(case: dict) -> dict[str, torch.Tensor]:
    chunk = build(case, 2, "fp32")
    ids, pos = inputs()
    chunk(ids, pos, None).float().square().mean().backward()
    return {n: p.grad.clone() for n, p in chunk.named_parameters() if p.grad is not None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"rows": ROWS, "seq": SEQ, "shape": SHAPE, "layer_bytes": {}, "grad_rel_diff": {}}
    for name, case in CASES.items():
        dtype = case.get("dtype", "bf16")
        os.environ[ENV_VAR] = case.get("kernels", "torch")
        res["layer_bytes"][name] = saved_bytes(build(case, 2, dtype)) - saved_bytes(build(case, 1, dtype))
    os.environ[ENV_VAR] = "torch"
    reference = grads(dict(tp=1))
    for name in ("tp1_selective_mlp", "tp1_full"):
        other = grads(CASES[name])
        res["grad_rel_diff"][name] = max(float((other[k] - v).norm() / v.norm().clamp(min=1e-30))
                                         for k, v in reference.items())
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(res))
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
