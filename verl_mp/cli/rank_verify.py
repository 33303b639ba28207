"""Rank program of ``verl-mp verify``: engine log-probs vs HF transformers on the same tokens.

Every rank builds the engine at the requested layout and computes per-token log-probs of
a fixed random batch (left- and right-padded rows of different lengths); global rank 0
also runs HF transformers in fp32 on each row alone (no padding: the ground truth) and
writes ``{"max_abs_diff": ...}`` as JSON to ``--out``. With ``--dtype bf16`` the engine
runs in bf16 but is still compared with HF in fp32, and HF's own bf16 error against fp32
is written too (``hf_bf16_max_abs_diff``): the CLI's bf16 tolerance is relative to it,
because bf16 rounding error depends on the model. Launched by `verl_mp.cli.engine`.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.models.hf_checkpoint import read_config

logger = logging.getLogger(__name__)


def token_batch(vocab_size: int, batch: int = 6, seq: int = 24, seed: int = 0):
    """``(input_ids [B, S], attention_mask [B, S])``: even rows left-padded, odd rows right-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
    lengths[0] = seq
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        start = seq - n if row % 2 == 0 else 0
        mask[row, start:start + n] = 1
    return ids * mask, mask


def hf_log_probs(model_dir: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """HF transformers log-probs in the engine's alignment, one unpadded row at a time (the
    model on ``device``; the result on the CPU)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    with torch.no_grad():
        for row in range(input_ids.shape[0]):
            cols = attention_mask[row].nonzero().squeeze(-1)
            ids = input_ids[row, cols][None, :].to(device)
            logp = torch.log_softmax(model(ids).logits.float(), dim=-1)
            picked = logp[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
            out[row, cols[:-1]] = picked.cpu()
    return out


def engine_log_probs(config: EngineConfig, input_ids, attention_mask) -> torch.Tensor:
    from verl_mp.engine.engine import MegatronEngine  # lazy: megatron, seconds to import

    engine = MegatronEngine(config)
    engine.load_hf()
    return engine.compute_log_probs(input_ids, attention_mask).cpu()


def compare(engine_lp: torch.Tensor, hf_lp: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """Max |diff| over positions that have a next token."""
    has_next = attention_mask.bool() & attention_mask.roll(-1, dims=1).bool()
    has_next[:, -1] = False
    return float((engine_lp - hf_lp).abs()[has_next].max())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--backend", default="auto")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                              expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp)
    config = EngineConfig(model_path=a.model, role="ref", dtype=a.dtype, parallel=parallel,
                          micro_batch_size=2, attention_backend=a.backend)
    vocab = read_config(Path(a.model))["vocab_size"]
    ids, mask = token_batch(vocab)
    engine_lp = engine_log_probs(config, ids, mask)
    if dist.get_rank() == 0:
        reference = hf_log_probs(a.model, ids, mask, torch.float32)
        result = {"max_abs_diff": compare(engine_lp, reference, mask)}
        if a.dtype == "bf16":
            hf_bf16 = hf_log_probs(a.model, ids, mask, torch.bfloat16)
            result["hf_bf16_max_abs_diff"] = compare(hf_bf16, reference, mask)
        with open(a.out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
