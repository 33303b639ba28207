"""What one packed micro-batch costs a transformers model under each attention implementation.

verl (use_remove_padding) packs a micro-batch's sequences into one row and passes their position ids;
transformers turns those into a block-diagonal mask. This times one forward of a Qwen2-1.5B-shaped
body (the peer job's; `--layers` of its 28) on such a row under SDPA, flex attention and eager, next
to the same sequences run one by one, and checks that every packed log-prob equals the per-sequence
one. Forward only (flex attention has no CPU backward).

    python benchmarks/peers/packed_attention.py --tokens 4096 8192 [--layers 2] [--out F.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def body(layers: int) -> Qwen2Config:
    # Qwen2-1.5B's shape (benchmarks/peers/prepare.py --size 1.5b), the tiny tokenizer's vocabulary
    return Qwen2Config(vocab_size=311, hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers,
                       num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True)


def lengths(total: int, mean: int, gen: torch.Generator) -> list[int]:
    out = []
    while sum(out) < total:
        out.append(int(torch.randint(mean // 4, 2 * mean - mean // 4, (), generator=gen)))
    out[-1] -= sum(out) - total
    return [n for n in out if n > 1]


@torch.no_grad()
def logprobs(model, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()  # warm-up (flex attention compiles here)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--mean", type=int, default=280, help="mean sequence length (the peer job's: ~18 + ~260)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--impls", nargs="+", default=["sdpa", "flex_attention", "eager"])
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = body(args.layers)
    state = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="eager").state_dict()
    models = {}
    for impl in dict.fromkeys([*args.impls, "sdpa"]):  # SDPA also runs the sequences one by one
        models[impl] = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        models[impl].load_state_dict(state)
    results = []
    for total in args.tokens:
        gen = torch.Generator().manual_seed(total)
        lens = lengths(total, args.mean, gen)
        seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in lens]
        ids = torch.cat(seqs)[None]
        pos = torch.cat([torch.arange(n) for n in lens])[None]
        keep = torch.ones(ids.shape[1] - 1, dtype=torch.bool)
        for end in torch.tensor(lens).cumsum(0)[:-1]:
            keep[end - 1] = False  # the last token of one sequence does not predict the next one's first
        one_by_one, ref = timed(lambda: torch.cat([logprobs(models["sdpa"], s[None], torch.arange(len(s))[None])
                                                   for s in seqs]), args.repeats)
        row = {"tokens": total, "sequences": len(lens), "layers": args.layers, "one_by_one_sdpa_s": round(one_by_one, 4)}
        for impl in args.impls:
            seconds, packed = timed(lambda: logprobs(models[impl], ids, pos), args.repeats)
            row[f"packed_{impl}_s"] = round(seconds, 4)
            row[f"packed_{impl}_max_abs_diff"] = float((packed[keep] - ref).abs().max())
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
