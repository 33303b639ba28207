"""The peer benchmark's inputs, written once and read by every system: a random Qwen2 body with
the project's tiny tokenizer (or that tokenizer padded to Qwen2's 151,936 entries) saved as an HF
checkpoint, and the synthetic arithmetic prompts in verl's parquet schema (``prompt`` as chat
messages, ``data_source``, ``reward_model.ground_truth``), which verl, TRL and verl_mp all read.

    python benchmarks/peers/prepare.py WORK [--size 1.5b|0.5b|tiny] [--vocab tiny|full] [--max-new 1024]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BODY = {
    "tiny": dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),  # a CPU dry run
    "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, intermediate_size=8960),
}
FULL_VOCAB = 151936


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--size", default="1.5b", choices=sorted(BODY))
    ap.add_argument("--vocab", default="tiny", choices=["tiny", "full"])
    ap.add_argument("--max-new", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args()

    import torch

    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    work = Path(args.work)
    stamp = work / "prepared.json"
    want = vars(args) | {"work": str(work)}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        print(f"prepare: {work} is up to date")
        return
    write_synthetic_dataset(work / "data", num_train=4096, num_test=64, seed=0)
    save_tiny_qwen2(work / "model", num_kv_heads=2, max_position_embeddings=args.max_new + 128, seed=0,
                    dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                    vocab_size=FULL_VOCAB if args.vocab == "full" else None, **BODY[args.size])
    stamp.write_text(json.dumps(want))
    print(f"prepare: wrote {work}/model and {work}/data")


if __name__ == "__main__":
    main()
