"""Rank program of ``verl-mp convert``: HF <-> megatron distributed checkpoint.

``hf-to-megatron``: build the engine at ``--tp/--pp`` (and ``--ep/--etp`` for
mixture-of-experts models), load HF safetensors (each rank its slices), save a megatron
dist checkpoint (model only; loadable at any TP/PP/EP).
``megatron-to-hf``: build the engine from the checkpoint's stored HF config, load the
checkpoint, export HF safetensors + index + config + tokenizer.

Every engine checkpoint carries the HF ``config.json`` and tokenizer files in ``hf/``,
so it converts back without the original directory.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch.distributed as dist

from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.checkpoint import META_FILE
from verl_mp.engine.config import EngineConfig

logger = logging.getLogger(__name__)

HF_SUBDIR = "hf"


def checkpoint_role(ckpt_dir: str) -> str:
    meta_file = Path(ckpt_dir) / META_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(f"{meta_file} not found: {ckpt_dir} is not a verl-mp engine checkpoint")
    role = json.loads(meta_file.read_text()).get("role", "actor")
    return "critic" if role == "critic" else "ref"


def _engine(model_dir: str, role: str, parallel: ParallelConfig, dtype: str):
    from verl_mp.engine.engine import MegatronEngine  # lazy: megatron; `verl-mp convert` imports this module

    return MegatronEngine(EngineConfig(model_path=model_dir, role=role, dtype=dtype, parallel=parallel,
                                       attention_backend="sdpa"))


def hf_to_megatron(model_dir: str, out_dir: str, parallel: ParallelConfig, dtype: str, critic: bool) -> None:
    engine = _engine(model_dir, "critic" if critic else "ref", parallel, dtype)
    engine.load_hf()
    engine.save_checkpoint(out_dir)


def megatron_to_hf(ckpt_dir: str, out_dir: str, parallel: ParallelConfig, dtype: str) -> None:
    engine = _engine(str(Path(ckpt_dir) / HF_SUBDIR), checkpoint_role(ckpt_dir), parallel, dtype)
    engine.load_checkpoint(ckpt_dir)
    engine.export_hf(out_dir)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("direction", choices=("hf-to-megatron", "megatron-to-hf"))
    p.add_argument("--src", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--critic", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                              expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp)
    if a.direction == "hf-to-megatron":
        hf_to_megatron(a.src, a.out, parallel, a.dtype, a.critic)
    else:
        megatron_to_hf(a.src, a.out, parallel, a.dtype)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
