"""MegatronEngine checks at one (TP, PP, DP) layout; results as JSON for tests/dist/test_engine_hf.py.

Checks (``--checks``, comma separated):

- ``logprobs``: every tiny architecture, loaded from HF, log-probs of a fixed batch.
- ``export``: HF export of every architecture (compared bit-for-bit by the test).
- ``variants``: on one model, log-probs and train-step metrics of configurations that must
  agree: sdpa vs local backend, sequence parallel on/off, packed (padding removed) and
  token-budget micro-batches vs fixed-size ones; critic values and a critic step.
- ``save``: train one step, save a dist checkpoint, then record log-probs, a second
  step's metrics and the log-probs after it. ``resume`` does the same from the saved
  checkpoint at this (different) layout.
- ``offload``: params/grads/optimizer offload frees the storages and restores them exactly.
- ``critic_fit``: a critic trained with the trainer's own value loss
  (`verl_mp.workers.losses.critic_loss`) on a fixed, learnable target: the loss of every step.
"""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.cli.rank_verify import token_batch
from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.schema import CriticConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import destroy_parallel
from verl_mp.workers.losses import critic_loss

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
BATCH = 7  # odd: uneven data-parallel slices


def batch_for(vocab: int, step: int) -> dict:
    ids, mask = token_batch(vocab, batch=BATCH, seed=step)
    g = torch.Generator().manual_seed(100 + step)
    has_next = mask.bool() & mask.roll(-1, 1).bool()
    has_next[:, -1] = False
    return dict(input_ids=ids, attention_mask=mask, response_mask=has_next.float(),
                advantages=torch.randn(ids.shape, generator=g), returns=torch.randn(ids.shape, generator=g))


def pg_loss(batch: dict, entropy_coef: float = 0.01):
    """Token-mean policy-gradient loss with an entropy bonus, normalised by global counts."""
    total = batch["response_mask"].sum()

    def loss_fn(outputs, mb):
        mask = mb["response_mask"]
        pg = -(outputs["log_probs"] * mb["advantages"] * mask).sum() / total
        ent = (outputs["entropy"] * mask).sum() / total
        return pg - entropy_coef * ent, {"pg_loss": pg.detach(), "entropy": ent.detach()}

    return loss_fn


def value_loss(batch: dict):
    total = batch["response_mask"].sum()

    def loss_fn(outputs, mb):
        err = (outputs["values"] - mb["returns"]) ** 2 * mb["response_mask"]
        loss = 0.5 * err.sum() / total
        return loss, {"vf_loss": loss.detach()}

    return loss_fn


class Runner:
    def __init__(self, a):
        self.a, self.results = a, {}
        self.parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp)

    def engine(self, arch: str, role: str = "ref", **kw) -> MegatronEngine:
        parallel = replace(self.parallel, sequence_parallel=kw.pop("sp", False))
        optim = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=1.0)
        kw = {"micro_batch_size": 2, **kw}
        cfg = EngineConfig(model_path=str(Path(self.a.models) / arch), role=role, parallel=parallel,
                           optim=optim, total_training_steps=4, **kw)
        engine = MegatronEngine(cfg)
        engine.load_hf()
        return engine

    def vocab(self, engine) -> int:
        return engine.spec.vocab_size

    def lp(self, engine, step: int = 0, **kw):
        b = batch_for(self.vocab(engine), step)
        return engine.compute_log_probs(b["input_ids"], b["attention_mask"], **kw)

    def check_logprobs(self):
        self.engines = {arch: self.engine(arch) for arch in ARCHS}
        self.results["logprobs"] = {a: self.lp(e).tolist() for a, e in self.engines.items()}

    def check_export(self):
        for arch, engine in self.engines.items():
            engine.export_hf(str(Path(self.a.work) / f"export_{arch}_tp{self.a.tp}pp{self.a.pp}"),
                             max_shard_bytes=60_000)

    def check_variants(self):
        out = self.results.setdefault("variants", {})
        for arch in ("qwen3", "mistral"):
            sdpa, local = self.engine(arch), self.engine(arch, attention_backend="local")
            out[f"{arch}_backend_diff"] = float((self.lp(sdpa) - self.lp(local)).abs().max())
        runs = {"base": {}, "packed": dict(remove_padding=True),
                "dynamic": dict(micro_batch_size=None, max_tokens_per_micro_batch=40),
                "packed_dynamic": dict(remove_padding=True, micro_batch_size=None, max_tokens_per_micro_batch=40),
                "sp": dict(sp=True), "packed_sp": dict(sp=True, remove_padding=True),
                "recompute_selective": dict(recompute="selective"), "recompute_full": dict(recompute="full"),
                "local_recompute_full": dict(attention_backend="local", recompute="full")}
        for name, kw in runs.items():
            engine = self.engine("qwen3", role="actor", **kw)
            lp, ent = self.lp(engine, with_entropy=True, temperature=0.7)
            out[name] = dict(lp=lp.tolist(), ent=ent.tolist(), before=self.lp(engine).tolist())
            b = batch_for(self.vocab(engine), 1)
            out[name]["metrics"] = engine.train_step(b, pg_loss(b), with_entropy=True)
            out[name]["after"] = self.lp(engine).tolist()
        critic = self.engine("llama", role="critic")
        b = batch_for(self.vocab(critic), 2)
        out["values"] = critic.compute_values(b["input_ids"], b["attention_mask"]).tolist()
        out["critic_metrics"] = critic.train_step(b, value_loss(b))
        out["values_after"] = critic.compute_values(b["input_ids"], b["attention_mask"]).tolist()
        critic.export_hf(str(Path(self.a.work) / "critic_export"))

    def check_save(self):
        engine = self.engine("llama", role="actor")
        b0 = batch_for(self.vocab(engine), 0)
        engine.train_step(b0, pg_loss(b0), with_entropy=True)
        engine.save_checkpoint(str(Path(self.a.work) / "ckpt"))
        self.results["resume"] = self._continue(engine)
        same_layout = self.engine("llama", role="actor")
        same_layout.load_checkpoint(str(Path(self.a.work) / "ckpt"))
        self.results["same_layout_resume"] = self._continue(same_layout)

    def check_resume(self):
        engine = self.engine("llama", role="actor")
        engine.load_checkpoint(str(Path(self.a.work) / "ckpt"))
        self.results["resume"] = self._continue(engine)

    def _continue(self, engine) -> dict:
        b1 = batch_for(self.vocab(engine), 1)
        before = self.lp(engine, 1)
        metrics = engine.train_step(b1, pg_loss(b1), with_entropy=True)
        return dict(before=before.tolist(), metrics=metrics, after=self.lp(engine, 1).tolist())

    def check_critic_fit(self, steps: int = 8):
        """PPO's critic update on one fixed batch whose return is +1 at even and -1 at odd
        tokens (learnable: a position sees its own token). As in PPO, the old values of each
        update are the critic's values just before it. Records, per step, the loss the
        trainer's loss reports and 0.5 * mean squared error of those old values in float64."""
        critic = self.engine("llama", role="critic")
        b = batch_for(self.vocab(critic), 3)
        b["returns"] = (b["input_ids"] % 2 == 0).float() * 2 - 1
        mask = b["response_mask"]
        tokens = float(mask.sum())
        seqs = float((mask.sum(-1) > 0).sum())
        reported, measured = [], []
        for _ in range(steps):
            b["values"] = critic.compute_values(b["input_ids"], b["attention_mask"]).float()
            err = (b["values"].double() - b["returns"].double()) ** 2
            measured.append(float(0.5 * (err * mask).sum() / tokens))
            loss_fn = critic_loss(CriticConfig(cliprange_value=0.5), tokens, seqs, b["input_ids"].shape[1])
            reported.append(critic.train_step(b, loss_fn)["vf_loss"])
        self.results["critic_fit"] = dict(reported=reported, measured=measured)

    def check_offload(self):
        engine = self.engine("qwen2", role="actor", dtype="bf16")
        b = batch_for(self.vocab(engine), 0)
        engine.train_step(b, pg_loss(b), with_entropy=True)
        before = self.lp(engine)
        freed = engine.offload(params=True, grads=True, optimizer=True)
        try:
            self.lp(engine)
            refused = False
        except RuntimeError:
            refused = True
        engine.onload()
        # a reference policy (no DDP wrapper, no optimizer) offloads its plain parameters
        ref = self.engine("qwen2", role="ref", dtype="bf16")
        ref_before = self.lp(ref)
        ref_freed = ref.offload(params=True)
        ref.onload()
        self.results["offload"] = dict(freed=freed, refused=refused,
                                       diff=float((self.lp(engine) - before).abs().max()),
                                       ref_freed=ref_freed, ref_diff=float((self.lp(ref) - ref_before).abs().max()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--models", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--checks", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    runner = Runner(a)
    for check in a.checks.split(","):
        start = time.time()
        getattr(runner, f"check_{check}")()
        runner.results.setdefault("seconds", {})[check] = round(time.time() - start, 1)
    if dist.get_rank() == 0:
        Path(a.out).write_text(json.dumps(runner.results))
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
