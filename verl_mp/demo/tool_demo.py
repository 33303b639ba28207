"""The tool-use demo (preset ``tiny_tool_cpu``): a tiny model learns with GRPO to call the calculator.

Task: ``What is 374*812?``, products of two 3-digit numbers. A 2-layer model of width 128
cannot multiply, but it can copy: with the calculator (a multi-turn rollout,
``rollout.multi_turn``) it writes a call, reads the product back and copies it::

    user:      What is 374*812?
    assistant: <tool_call>\\n{"name": "calculator", "arguments": {"expression": "374*812"}}\\n</tool_call>
    tool:      303688
    assistant: #### 303688

The warm start (supervised, like the arithmetic demo's, `verl_mp.demo.warm_start`) imitates a
sloppy teacher: most of its answers come straight from memory (``#### 303688`` with no call,
which the model cannot get right), some call the calculator well, and some write a call that
is not JSON (a missing brace), read the error and then answer from memory. Greedy decoding
copies the majority habit, so the warm-started model answers from memory and scores about 0;
sampled, it sometimes calls the tool and then gets the reward. GRPO, rewarded only for the
exact product (``arith_tool``), learns to call the tool, and to call it well: held-out
accuracy and ``rollout/multi_turn/tool_call_success`` rise (docs/agentic.md).

The conversations are tokenized exactly as the rollout will see them: the prompt through the
chat template, the model's turns as their own ids plus EOS, the tool responses through
`verl_mp.data.chat_fragments.ToolResponseFormat`; the loss covers the model's turns only.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from verl_mp.data.chat_fragments import ToolResponseFormat
from verl_mp.demo.tiny_models import qwen2_shape, tiny_tokenizer_config
from verl_mp.demo.warm_start import WARM_START_RECORD, DemoSettings, _probe_ids, demo_model_shape
from verl_mp.reward.rules import arith_exact_reward
from verl_mp.reward.tool_parser import hermes
from verl_mp.reward.tools import calculator

logger = logging.getLogger(__name__)

DATA_SOURCE = "synthetic_tool_arith"
"""Scored by ``arith_tool`` (`verl_mp.reward.rules.arith_tool_reward`)."""
TOOL_WORDS = ("name", "calculator", "arguments", "expression", '{"', '":', ' "', '",', ' {"', '"}}\n', '"}\n')
"""Merged tokens for the JSON of a calculator call (24 tokens instead of 87 bytes)."""
TOOL_TOKENS = ("<tool_call>", "</tool_call>")
"""Whole tokens, as in Qwen's tokenizer."""


@dataclass(frozen=True)
class ToolDemoSettings(DemoSettings):
    """The tool demo's warm start; every field is part of the cache key."""

    direct_fraction: float = 0.6
    """Teacher answers from memory (no call): greedy decoding copies this majority."""
    malformed_fraction: float = 0.2
    """Teacher writes a call with a missing brace, reads the error, answers from memory. The
    rest (0.2) call the calculator well and copy its answer."""
    max_new_tokens: int = 32
    """Tokens per turn when the warm start is evaluated (the preset samples as many)."""
    max_tool_response_tokens: int = 16
    """Tool responses are cut to this many tokens, as the preset's rollout cuts them
    (``rollout.multi_turn.max_tool_response_tokens``): the warm start sees what RL will."""
    sft_steps: int = 600
    sft_threads: int = 1
    """torch threads of the warm start: on a 2-core machine shared with another busy process, 2
    threads ran a step 10x slower than 1 (0.95 s against 0.096 s)."""

    def build_tokenizer(self):
        """The demo's tokenizer (`verl_mp.demo.warm_start.demo_key` hashes it)."""
        return build_tool_tokenizer()

    def build_warm_start(self, root: Path, model_dir: Path, data_dir: Path) -> None:
        """Called by `verl_mp.demo.warm_start.build_demo` when the cache is cold."""
        build_tool_demo(root, model_dir, data_dir, self)


TOOL_DEMO = ToolDemoSettings(max_digits=3, second_digits=3)


def build_tool_tokenizer():
    from verl_mp.demo.tokenizer import build_tiny_tokenizer  # lazy: transformers, ~2 s

    return build_tiny_tokenizer(extra_words=TOOL_WORDS, added_tokens=TOOL_TOKENS)


def call_text(a: int, b: int, well_formed: bool = True) -> str:
    """The assistant's calculator call in the Hermes format (``rollout.multi_turn.tool_parser=hermes``)."""
    end = '"}}\n' if well_formed else '"}\n'
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a}*{b}{end}</tool_call>'


def problem_rows(num: int, seed: int, split: str, exclude: set | None = None) -> list[dict]:
    rng, seen, rows = random.Random(f"{seed}:{split}:tool"), set(exclude or ()), []
    while len(rows) < num:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": f"What is {a}*{b}?"}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                     "extra_info": {"split": split, "index": len(rows), "a": a, "b": b}})
    return rows


def write_tool_dataset(out_dir: Path, s: ToolDemoSettings) -> tuple[Path, Path]:
    from verl_mp.data.schema import write_rows  # lazy: pyarrow; `verl-mp train` imports this module

    test = problem_rows(s.num_test, s.seed, "test")
    train = problem_rows(s.num_train, s.seed, "train", {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in test})
    return write_rows(train, out_dir / "train.parquet"), write_rows(test, out_dir / "test.parquet")


def conversation(tok, fmt, prompt_ids: list[int], a: int, b: int, kind: str,
                 max_tool_tokens: int = 16) -> tuple[list[int], list[int]]:
    """``(ids, loss mask)`` of one teacher conversation: ``direct``, ``good`` or ``malformed``
    (the tool response's content cut to ``max_tool_tokens``, as the rollout cuts it)."""
    def turn(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]

    answer = turn(f"#### {a * b}")
    if kind == "direct":
        return prompt_ids + answer, [0] * len(prompt_ids) + [1] * len(answer)
    text = call_text(a, b, well_formed=kind == "good")
    (call,) = hermes(text)
    result = calculator(call.arguments) if call.error is None else f"error: malformed tool call: {call.error}"
    tool = fmt.encode([fmt.content_ids(result)[:max_tool_tokens]], after_eos=True)
    first = turn(text)
    ids = prompt_ids + first + tool + answer
    return ids, [0] * len(prompt_ids) + [1] * len(first) + [0] * len(tool) + [1] * len(answer)


def build_tool_demo(root: Path, model_dir: Path, data_dir: Path, s: ToolDemoSettings) -> None:
    """Data, a random tiny Qwen2 with the tool tokenizer, the warm start, its held-out scores."""
    start = time.monotonic()
    train, test = write_tool_dataset(data_dir, s)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tool_tokenizer()
    config, _ = tiny_tokenizer_config(Qwen2Config, Qwen2ForCausalLM, qwen2_shape(**demo_model_shape(s)))
    config.vocab_size = len(tok)
    torch.manual_seed(s.seed)
    model = Qwen2ForCausalLM(config)
    fmt = ToolResponseFormat(tok)
    examples = _examples(tok, train)
    _sft(model, tok, fmt, examples, s)
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    scores = greedy_tool_scores(model, tok, fmt, _examples(tok, test), s.max_new_tokens, s.max_tool_response_tokens)
    record = {"settings": asdict(s), "probe_ids": _probe_ids(tok), "held_out": scores,
              "seconds": round(time.monotonic() - start, 1), "built_at": time.time()}
    (model_dir / WARM_START_RECORD).write_text(json.dumps(record, indent=1))
    logger.info("tool demo: warm start done in %.0f s; greedy held-out: exact %.3f, called the tool %.3f, well-formed "
                "calls %.3f", record["seconds"], scores["exact"], scores["called_tool"], scores["call_ok"])


def _examples(tok, parquet: Path) -> list[tuple[list[int], int, int, str]]:
    import pyarrow.parquet as pq

    out = []
    for row in pq.read_table(parquet).to_pylist():
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        info = row["extra_info"]
        out.append((tok(text, add_special_tokens=False)["input_ids"], info["a"], info["b"],
                    row["reward_model"]["ground_truth"]))
    return out


def _sft(model, tok, fmt, examples, s: ToolDemoSettings) -> None:
    """Teacher-forced cross entropy on the model's turns (AdamW, warm-up then linear decay)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(s.sft_threads)
    try:
        _sft_steps(model, tok, fmt, examples, s)
    finally:
        torch.set_num_threads(threads)


def _sft_steps(model, tok, fmt, examples, s: ToolDemoSettings) -> None:
    rng = random.Random(s.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / s.sft_warmup_steps) * max(0.05, 1 - i / s.sft_steps))
    model.train()
    for step in range(s.sft_steps):
        batch = []
        for _ in range(s.sft_batch):
            prompt, a, b, _ = rng.choice(examples)
            u = rng.random()
            kind = "direct" if u < s.direct_fraction else \
                "malformed" if u < s.direct_fraction + s.malformed_fraction else "good"
            batch.append(conversation(tok, fmt, prompt, a, b, kind, s.max_tool_response_tokens))
        opt.zero_grad()
        loss = _grouped_loss(model, batch, tok.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            logger.info("tool demo sft step %d/%d loss %.4f", step, s.sft_steps, loss.item())
    model.eval()


def _grouped_loss(model, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross entropy over the batch's model tokens, computed per group of equal length (a
    direct answer is a third as long as a conversation with a call: no padding to the longest)."""
    groups: dict[int, list] = {}
    for example in batch:
        groups.setdefault(len(example[0]), []).append(example)
    total = sum(sum(mask) for _, mask in batch)
    loss = torch.zeros(())
    for group in groups.values():
        ids, labels = _pad(group, pad_id)
        logits = model(input_ids=ids).logits[:, :-1].float()
        loss = loss + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                        labels[:, 1:].reshape(-1), reduction="sum")
    return loss / total


def _pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(seq)] = torch.where(torch.tensor(mask) > 0, torch.tensor(seq), torch.tensor(-100))
    return ids, labels


@torch.no_grad()
def greedy_tool_scores(model, tok, fmt, examples, max_new_tokens: int = 32,
                       max_tool_tokens: int = 16) -> dict[str, float]:
    """Greedy held-out scores of the two-turn loop run with HF generate: ``exact`` (what RL is
    rewarded for), ``called_tool`` (the first turn called a tool), ``call_ok`` (the calculator
    answered it)."""
    first = _greedy(model, tok, [e[0] for e in examples], max_new_tokens)
    follow, exact, called, ok = {}, 0.0, 0.0, 0.0
    for i, (example, turn) in enumerate(zip(examples, first, strict=True)):
        calls = hermes(tok.decode(turn, skip_special_tokens=False))
        if not calls or turn[-1:] != [tok.eos_token_id]:
            exact += arith_exact_reward("", tok.decode(turn, skip_special_tokens=True), example[-1])["score"]
            continue
        called += 1
        try:
            result = calculator(calls[0].arguments) if calls[0].error is None and calls[0].name == "calculator" \
                else None
        except ValueError:
            result = None
        ok += result is not None
        content = result if result is not None else "error: the call failed"
        follow[i] = example[0] + turn + fmt.encode([fmt.content_ids(content)[:max_tool_tokens]], after_eos=True)
    second = _greedy(model, tok, list(follow.values()), max_new_tokens)
    for i, turn in zip(follow, second, strict=True):
        exact += arith_exact_reward("", tok.decode(turn, skip_special_tokens=True), examples[i][-1])["score"]
    n = max(len(examples), 1)
    return {"exact": exact / n, "called_tool": called / n, "call_ok": ok / n}


def _greedy(model, tok, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (up to and including EOS), equal-length prompts batched together."""
    out: list[list[int] | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for length, rows in by_length.items():
        gen = model.generate(torch.tensor([prompts[i] for i in rows]), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        for i, seq in zip(rows, gen.tolist(), strict=True):
            turn = seq[length:]
            out[i] = turn[: turn.index(tok.eos_token_id) + 1] if tok.eos_token_id in turn else turn
    return out  # type: ignore[return-value]
