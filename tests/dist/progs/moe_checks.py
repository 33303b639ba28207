"""MegatronEngine checks of the tiny mixture-of-experts models at one (TP, PP, EP, expert-TP)
layout; results as JSON for tests/dist/test_engine_moe.py.

Checks (``--checks``, comma separated):

- ``logprobs``: every tiny MoE architecture (DeepSeek-V3 included), loaded from HF, log-probs
  of a fixed batch.
- ``export``: HF export of every architecture (compared bit for bit by the test).
- ``train``: Qwen2-MoE actor (shared expert) and DeepSeek-V3 actor (multi-latent attention,
  sigmoid router) with load-balancing and z-loss: one step's metrics and the log-probs after
  it (compared across layouts by the test).
- ``save``: after that step, save a dist checkpoint, then a second step's metrics and
  log-probs (``resume``); ``resume`` loads the checkpoint into a new engine at this layout
  (the saving one's or another) and does the same (``resumed``).
- ``packed``: without router losses (they depend on how tokens are grouped into
  micro-batches), one step with padded fixed-size micro-batches and one with packed
  token-budget ones, whose counts differ between data-parallel ranks (padding micro-batches).
- ``critic``: a Qwen2-MoE critic (value head on the MoE body, router losses on): values of a
  fixed batch, one value-loss step, the values after it, its HF export
  (``*ForTokenClassification``) and the values of a critic engine loaded from that export.
- ``grouped``: `GroupedExperts` (``moe.grouped_gemm``, the default) against megatron's
  SequentialMLP: a Qwen2-MoE and a DeepSeek-V3 actor each built both ways from the same HF
  weights (log-probs, one train step, log-probs after it), and one experts module called
  directly both ways with uneven and empty token counts, fp32 and bf16 (outputs and
  gradients).
- ``replay``: routing replay on Qwen3-MoE and Qwen2-MoE (padded micro-batches, and packed
  token-budget ones): the recorded natural routing, log-probs replaying it, log-probs and
  recorded routing when replaying `forced_routing` of it, and the routing a train step used
  when replaying that; that train step's loss terms and gradients (no clipping: each
  router's weight gradient where the dense data-parallel size is 1, so that it is whole on
  every rank, and every expert's fc1/fc2 gradient norm; experts are never data-parallel in
  these layouts), for comparison with HF transformers under the same forced routing.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from engine_checks import batch_for, pg_loss, value_loss

from verl_mp.config.moe import MoEConfig
from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.runtime import destroy_parallel

ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3")
ROUTER_LOSSES = MoEConfig(aux_loss_coeff=0.1, z_loss_coeff=0.01)


class Runner:
    def __init__(self, a):
        self.a, self.results, self.engines = a, {}, {}
        self.parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                                       expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp,
                                       sequence_parallel=a.tp > 1)

    def engine(self, arch: str, role: str = "ref", moe: MoEConfig = ROUTER_LOSSES, clip_grad: float = 1.0,
               **kw) -> MegatronEngine:
        kw = {"micro_batch_size": 2, **kw}
        cfg = EngineConfig(model_path=str(Path(self.a.models) / arch), role=role, parallel=self.parallel,
                           optim=OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=clip_grad), moe=moe,
                           total_training_steps=4, attention_backend="sdpa", **kw)
        engine = MegatronEngine(cfg)
        engine.load_hf()
        return engine

    def lp(self, engine, step: int = 0):
        b = batch_for(engine.spec.vocab_size, step)
        return engine.compute_log_probs(b["input_ids"], b["attention_mask"])

    def step(self, engine, step: int) -> dict:
        b = batch_for(engine.spec.vocab_size, step)
        metrics = engine.train_step(b, pg_loss(b), with_entropy=True)
        return dict(metrics=metrics, after=self.lp(engine, step).tolist())

    def check_logprobs(self):
        self.engines = {arch: self.engine(arch) for arch in ARCHS}
        self.results["logprobs"] = {a: self.lp(e).tolist() for a, e in self.engines.items()}

    def check_export(self):
        for arch, engine in self.engines.items():
            engine.export_hf(str(Path(self.a.work) / f"export_{arch}_{self.a.name}"), max_shard_bytes=60_000)

    def check_train(self):
        self.results["train_deepseek_v3"] = self.step(self.engine("deepseek_v3", role="actor"), 1)
        self.actor = self.engine("qwen2_moe", role="actor")
        self.results["train"] = self.step(self.actor, 1)

    def check_save(self):
        self.actor.save_checkpoint(str(Path(self.a.work) / "ckpt"))
        self.results["resume"] = dict(before=self.lp(self.actor, 2).tolist(), **self.step(self.actor, 2))

    def check_packed(self):
        out = self.results.setdefault("packed", {})
        budget = dict(remove_padding=True, micro_batch_size=None, max_tokens_per_micro_batch=40)
        for name, kw in (("padded", {}), ("packed", budget)):
            engine = self.engine("qwen3_moe", role="actor", moe=MoEConfig(), **kw)
            b = batch_for(engine.spec.vocab_size, 1)
            mbs = engine._micro_batches(b)
            counts = [None] * dist.get_world_size()
            dist.all_gather_object(counts, (len(mbs), sum(mb.dummy for mb in mbs)))
            out[name] = dict(micro_batches=counts, **self.step(engine, 1))

    def check_replay(self):
        out = self.results.setdefault("replay", {})
        packed = dict(remove_padding=True, micro_batch_size=None, max_tokens_per_micro_batch=40)
        for arch, kw in (("qwen3_moe", {}), ("qwen2_moe", packed)):
            # no clipping: the gradients stay as the loss made them, comparable with HF's
            engine = self.engine(arch, role="actor", moe=MoEConfig(), clip_grad=0.0, **kw)
            b = batch_for(engine.spec.vocab_size, 0)
            ids, mask = b["input_ids"], b["attention_mask"]
            natural = engine.compute_log_probs(ids, mask, record_routing=True)
            routing = engine.recorded_routing
            same = engine.compute_log_probs(ids, mask, routed_experts=routing, record_routing=True)
            same_routing = engine.recorded_routing
            forced = forced_routing(routing, engine.spec.moe.num_experts)
            lp = engine.compute_log_probs(ids, mask, routed_experts=forced, record_routing=True)
            used = engine.recorded_routing
            # the first step: the weights are still the HF checkpoint's
            metrics = engine.train_step({**b, "routed_experts": forced}, pg_loss(b), with_entropy=True,
                                        record_routing=True)
            train_used, train_grads = engine.recorded_routing, moe_grads(engine)
            corrupt = routing.clone()
            corrupt[0, -1, 0] = torch.tensor([engine.spec.moe.num_experts, 0])  # an expert past the last one
            try:  # refused by value before any router sees it
                engine.compute_log_probs(ids, mask, routed_experts=corrupt)
                refused = ""
            except ValueError as err:
                refused = str(err)
            out[arch] = dict(natural=natural.tolist(), routing=routing.tolist(), corrupt_refused=refused,
                             replayed_natural_max_diff=float((same - natural).abs().max()),
                             replayed_natural_routing_equal=bool(torch.equal(same_routing, routing)),
                             forced=lp.tolist(), forced_used=used.tolist(),
                             train_used=train_used.tolist(),
                             train_metrics={k: metrics[k] for k in ("pg_loss", "entropy")},
                             train_grads=train_grads)

    def check_critic(self):
        critic = self.engine("qwen2_moe", role="critic")
        b = batch_for(critic.spec.vocab_size, 2)
        before = critic.compute_values(b["input_ids"], b["attention_mask"])
        metrics = critic.train_step(b, value_loss(b))
        after = critic.compute_values(b["input_ids"], b["attention_mask"])
        exported = Path(self.a.work) / f"critic_{self.a.name}"
        critic.export_hf(str(exported))
        # the exported *ForTokenClassification checkpoint loads back into a critic engine
        again = MegatronEngine(EngineConfig(model_path=str(exported), role="critic", parallel=self.parallel,
                                            micro_batch_size=2, attention_backend="sdpa", moe=ROUTER_LOSSES))
        again.load_hf()
        reloaded = again.compute_values(b["input_ids"], b["attention_mask"])
        self.results["critic"] = dict(before=before.tolist(), after=after.tolist(), reloaded=reloaded.tolist(),
                                      metrics=metrics)

    def check_grouped(self):
        from megatron.core.transformer.moe.experts import SequentialMLP

        from verl_mp.models.grouped_experts import GroupedExperts

        out = self.results.setdefault("grouped", {})
        for arch in ("qwen2_moe", "deepseek_v3"):
            for grouped in (True, False):
                engine = self.engine(arch, role="actor", moe=MoEConfig(aux_loss_coeff=0.1, grouped_gemm=grouped))
                experts = [m for c in engine.chunks for m in c.modules() if isinstance(m, SequentialMLP)]
                out[f"{arch}_{grouped}"] = dict(
                    before=self.lp(engine).tolist(), **self.step(engine, 1),
                    grouped_modules=sum(type(m) is GroupedExperts for m in experts), expert_modules=len(experts))
                if grouped and arch == "qwen2_moe":
                    out["direct"] = direct_calls(experts[0])

    def check_resume(self):
        engine = self.engine("qwen2_moe", role="actor")
        engine.load_checkpoint(str(Path(self.a.work) / "ckpt"))
        self.results["resumed"] = dict(before=self.lp(engine, 2).tolist(), **self.step(engine, 2))


def moe_grads(engine: MegatronEngine) -> dict:
    """Gradients the last train step left in the MoE layers (``main_grad``), from every rank:
    ``router.<layer>`` the router weight ``[E, hidden]`` (only where the dense data-parallel
    size is 1: the distributed optimizer leaves a DP rank only its own part reduced) and
    ``fc1.<layer>.<expert>`` / ``fc2.<layer>.<expert>`` each expert's weight gradient norm,
    global layer and expert indices."""
    from megatron.core import parallel_state as mps

    local = {}
    ep_rank = mps.get_expert_model_parallel_rank()
    for chunk in engine.chunks:
        for layer in chunk.module.decoder.layers:
            index, mlp = layer.layer_number - 1, layer.mlp
            if not hasattr(mlp, "router"):
                continue
            if engine.state.dp_size == 1:
                local[f"router.{index}"] = mlp.router.weight.main_grad.detach().cpu().tolist()
            experts = mlp.experts.local_experts
            for j, expert in enumerate(experts):
                e = ep_rank * len(experts) + j
                local[f"fc1.{index}.{e}"] = float(expert.linear_fc1.weight.main_grad.norm())
                local[f"fc2.{index}.{e}"] = float(expert.linear_fc2.weight.main_grad.norm())
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, local)
    return {k: v for d in every_rank for k, v in d.items()}


def forced_routing(routing: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Every token's experts shifted by one (``e -> (e + 1) % E``: still k distinct experts),
    -1 kept: a routing the model would not choose."""
    return torch.where(routing >= 0, (routing + 1) % num_experts, routing)


def direct_calls(module) -> dict:
    """``module`` (a `GroupedExperts`) called as itself and as SequentialMLP on the same
    inputs, with detached copies of its weights (``functional_call``: the engine's gradient
    hooks stay untouched): max |difference| of the output and of the input and weight
    gradients, per case."""
    from verl_mp.models.grouped_experts import SequentialReference

    n, hidden = module.num_local_experts, module.local_experts[0].linear_fc2.weight.shape[0]
    counts = {"uneven": [5, 11] + [3] * (n - 2), "first_empty": [0, 9] + [2] * (n - 2),
              "all_in_last": [0] * (n - 1) + [13], "no_tokens": [0] * n}
    out = {}
    for dtype, dtype_name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for name, tokens in counts.items():
            g = torch.Generator().manual_seed(len(out))
            x = torch.randn(sum(tokens), hidden, generator=g).to(dtype)
            probs = torch.rand(sum(tokens), generator=g)
            per_expert = torch.tensor(tokens)
            results = []
            for runner, prefix in ((module, ""), (SequentialReference(module), "experts.")):
                weights = {prefix + k: p.detach().clone().to(dtype).requires_grad_()
                           for k, p in module.named_parameters()}
                xi = x.clone().requires_grad_()
                y, _ = torch.func.functional_call(runner, weights, (xi, per_expert, probs))
                (y.float() * torch.linspace(-1, 1, hidden)).sum().backward()
                grads = [torch.zeros_like(w) if w.grad is None else w.grad for w in weights.values()]
                results.append((y.detach().float(), xi.grad.float(), [gr.float() for gr in grads]))
            (y1, x1, w1), (y2, x2, w2) = results
            out[f"{dtype_name}_{name}"] = dict(
                grouped_path=bool(module.grouped_applies(x)), rows=int(y1.shape[0]),
                out=float((y1 - y2).abs().max()) if y1.numel() else 0.0,
                out_scale=float(y2.abs().max()) if y2.numel() else 0.0,
                grad_x=float((x1 - x2).abs().max()) if x1.numel() else 0.0,
                grad_w=max(float((a - b).abs().max()) for a, b in zip(w1, w2, strict=True)),
                grad_w_scale=max(float(b.abs().max()) for b in w2))
    return out


def main():
    p = argparse.ArgumentParser()
    for flag in ("--tp", "--pp", "--ep"):
        p.add_argument(flag, type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--name", required=True)
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
