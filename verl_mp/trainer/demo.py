"""The embedded demo: a tiny Qwen2 model learns synthetic arithmetic with GRPO on a CPU.

Nothing is downloaded: the project writes the data (`verl_mp.data.synthetic`), builds the
tokenizer and a random tiny Qwen2 model, then warm-starts it with a short supervised
stage so that RL has reward signal from the first step. The warm-started checkpoint is
cached (keyed by its settings), so re-runs go straight to RL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from verl_mp.config.schema import RootConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoSettings:
    num_train: int = 4000
    num_test: int = 128
    max_digits: int = 2
    hidden_size: int = 128
    num_layers: int = 2
    sft_steps: int = 300
    sft_batch: int = 64
    sft_lr: float = 3e-3
    seed: int = 0


def prepare_demo(cfg: RootConfig, settings: DemoSettings = DemoSettings()) -> RootConfig:
    """Build (or reuse) the demo data and warm-started model; point ``cfg`` at them."""
    key = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()[:12]
    root = Path(os.environ.get("VERL_MP_CACHE", ".cache/verl_mp")) / f"demo-{key}"
    model_dir, data_dir = root / "sft_model", root / "data"
    if not (model_dir / "config.json").exists():
        _build(root, model_dir, data_dir, settings)
    else:
        logger.info("demo: reusing cached warm-started model %s", model_dir)
    data = replace(cfg.data, train_files=[str(data_dir / "train.parquet")],
                   val_files=[str(data_dir / "test.parquet")])
    return replace(cfg, model=replace(cfg.model, path=str(model_dir)), data=data)


def _build(root: Path, model_dir: Path, data_dir: Path, s: DemoSettings) -> None:
    from verl_mp.data.synthetic import write_synthetic_dataset
    from verl_mp.utils.tiny_hf import save_tiny_qwen2

    logger.info("demo: building data and a tiny model under %s (one-time)", root)
    write_synthetic_dataset(data_dir, num_train=s.num_train, num_test=s.num_test, seed=s.seed,
                            max_digits=s.max_digits)
    tmp = root / "init_model"
    save_tiny_qwen2(tmp, hidden_size=s.hidden_size, num_layers=s.num_layers,
                    intermediate_size=4 * s.hidden_size, seed=s.seed)
    accuracy = _sft(tmp, data_dir / "train.parquet", data_dir / "test.parquet", model_dir, s)
    logger.info("demo: warm start done, greedy held-out accuracy %.3f", accuracy)


def _examples(tokenizer, parquet: Path) -> list[tuple[list[int], list[int], str]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()
    out = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        answer = row["reward_model"]["ground_truth"]
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(f"#### {answer}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((p_ids, r_ids, answer))
    return out


def _sft(init_dir: Path, train: Path, test: Path, out_dir: Path, s: DemoSettings) -> float:
    """Teacher-forced cross entropy on the response tokens only; returns held-out accuracy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    examples = _examples(tok, train)
    rng = random.Random(s.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / s.sft_steps))
    model.train()
    for step in range(s.sft_steps):
        ids, labels = _pad([rng.choice(examples) for _ in range(s.sft_batch)], tok.pad_token_id)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0:
            logger.info("demo sft step %d loss %.4f", step, loss.item())
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return greedy_accuracy(model, tok, _examples(tok, test))


def _pad(batch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) + len(r) for p, r, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (p, r, _) in enumerate(batch):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
    return ids, labels


@torch.no_grad()
def greedy_accuracy(model, tok, examples, max_new_tokens: int = 8) -> float:
    model.eval()
    correct = 0
    for p_ids, _, answer in examples:
        out = model.generate(torch.tensor([p_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, len(p_ids):], skip_special_tokens=True)
        correct += text.rpartition("####")[2].strip() == answer
    return correct / max(len(examples), 1)
