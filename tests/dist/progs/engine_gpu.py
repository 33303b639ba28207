"""GPU checks at TP=2 (2 ranks), for tests/gpu/test_engine_sdpa.py.

- SDPA spec vs megatron's local spec: log-probs in ``--dtype`` (bf16 on GPU), each also
  against HF in fp32 next to HF's own ``--dtype`` error (the rounding-noise floor);
  the SDPA spec in fp32 against HF fp32.
- Sequence parallelism on/off and packed sequences: same log-probs and train-step metrics.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import destroy_parallel
from verl_mp.cli.rank_verify import compare, hf_log_probs, token_batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def engine(model: str, dtype: str, role: str = "ref", sp: bool = False, **kw) -> MegatronEngine:
    parallel = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=sp)
    cfg = EngineConfig(model_path=model, role=role, dtype=dtype, parallel=parallel, micro_batch_size=4,
                       optim=OptimConfig(lr=1e-4, weight_decay=0.0, clip_grad=1.0), **kw)
    e = MegatronEngine(cfg)
    e.load_hf()
    return e


def pg_loss(batch):
    mask = batch["response_mask"]
    total = mask.sum()

    def loss_fn(outputs, mb):
        m = mb["response_mask"]
        pg = -(outputs["log_probs"] * mb["advantages"] * m).sum() / total
        return pg, {"pg_loss": pg.detach(), "entropy": ((outputs["entropy"] * m).sum() / total).detach()}

    return loss_fn


def train_batch(ids, mask):
    has_next = mask.bool() & mask.roll(-1, 1).bool()
    has_next[:, -1] = False
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    return dict(input_ids=ids, attention_mask=mask, response_mask=has_next.float(), advantages=adv)


def mean_abs(diff: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |diff| over positions that have a next token (as `compare`, but the mean)."""
    has_next = mask.bool() & mask.roll(-1, dims=1).bool()
    has_next[:, -1] = False
    return float(diff.abs()[has_next].mean())


def timed_log_probs(e, ids, mask):
    e.compute_log_probs(ids, mask)  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    lp = e.compute_log_probs(ids, mask)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return lp.cpu(), time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
    ids, mask = token_batch(vocab, batch=8, seq=256)
    res = {"dtype": a.dtype}
    lp_sdpa, res["sdpa_s"] = timed_log_probs(engine(a.model, a.dtype, attention_backend="sdpa"), ids, mask)
    lp_local, res["local_s"] = timed_log_probs(engine(a.model, a.dtype, attention_backend="local"), ids, mask)
    lp_fp32 = engine(a.model, "fp32", attention_backend="sdpa").compute_log_probs(ids, mask).cpu()
    res["sdpa_vs_local"] = compare(lp_sdpa, lp_local, mask)
    batch = train_batch(ids, mask)
    runs = {"base": {}, "sp": dict(sp=True), "packed_sp": dict(sp=True, remove_padding=True)}
    after_lp = {}
    for name, kw in runs.items():
        actor = engine(a.model, a.dtype, role="actor", attention_backend="sdpa", **kw)
        lp = actor.compute_log_probs(ids, mask).cpu()
        res[name] = dict(lp_diff=compare(lp, lp_sdpa, mask))
        if torch.cuda.is_available() or not kw.get("sp"):  # CPU: SP backward needs CUDA (docs/engine.md)
            res[name]["metrics"] = actor.train_step(batch, pg_loss(batch), with_entropy=True)
            after = actor.compute_log_probs(ids, mask).cpu()
            res[name]["change"] = mean_abs(after - lp, mask)
            after_lp[name] = after
    for name in list(after_lp)[1:]:
        res[name]["after_mean_diff"] = mean_abs(after_lp[name] - after_lp["base"], mask)
        res[name]["after_max_diff"] = compare(after_lp[name], after_lp["base"], mask)
    if dist.get_rank() == 0:
        hf_fp32 = hf_log_probs(a.model, ids, mask, torch.float32)
        hf_low = hf_log_probs(a.model, ids, mask, DTYPES[a.dtype])
        for name, lp in (("sdpa", lp_sdpa), ("local", lp_local), ("hf", hf_low)):
            res[f"{name}_err_max"] = compare(lp, hf_fp32, mask)
            res[f"{name}_err_mean"] = mean_abs(lp - hf_fp32, mask)
        res.update(sdpa_fp32_vs_hf_fp32=compare(lp_fp32, hf_fp32, mask),
                   sdpa_vs_local_mean=mean_abs(lp_sdpa - lp_local, mask))
        Path(a.out).write_text(json.dumps(res))
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
