"""A rollout backend with no vLLM: HF transformers generation with a KV cache.

A correctness fallback for machines without vLLM: it is much slower (no paged
attention, no continuous batching, no tensor parallelism: every rank holds the full
model and generates its data-parallel share of the prompts). Log-probs are those of the
sampled tokens after temperature, the same quantity the vLLM backend returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist

from verl_mp.config.rollout import RolloutConfig, SamplingConfig
from verl_mp.rollout.types import RolloutOutput
from verl_mp.utils.dtypes import TORCH_DTYPES

logger = logging.getLogger(__name__)


class HFRollout:
    def __init__(self, cfg: RolloutConfig, model_path: str, eos_token_ids: list[int] | None = None):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=TORCH_DTYPES[cfg.dtype]).to(self.device).eval()
        eos = eos_token_ids if eos_token_ids is not None else self.model.generation_config.eos_token_id
        self.eos_ids = set([eos] if isinstance(eos, int) else (eos or []))
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 record_routing: bool = False, carry=None) -> RolloutOutput:
        if carry is not None:  # check_multi_turn refuses multi-turn (and so carry-over) first
            raise ValueError("rollout.multi_turn.carry_over needs rollout.backend=vllm")
        if record_routing:  # build_rollout refuses it first
            raise ValueError("routing capture needs rollout.backend=vllm")
        local = {}
        for i in range(self.rank, len(prompt_ids), self.world):
            local[i] = [self._sample_one(prompt_ids[i], sampling, i * sampling.n + j) for j in range(sampling.n)]
        if self.world > 1:
            parts: list = [None] * self.world
            dist.all_gather_object(parts, local)
            local = {k: v for part in parts for k, v in part.items()}
        flat = [s for i in range(len(prompt_ids)) for s in local[i]]
        return RolloutOutput(prompt_ids=[list(p) for p in prompt_ids], response_ids=[s[0] for s in flat],
                             response_logprobs=[s[1] for s in flat] if sampling.logprobs else None, n=sampling.n,
                             finished=[s[2] for s in flat])

    def _sample_one(self, prompt: list[int], sampling: SamplingConfig, index: int):
        gen = torch.Generator(device=self.device)
        gen.manual_seed((sampling.seed or 0) + index)
        stops = (set() if sampling.ignore_eos else self.eos_ids) | set(sampling.stop_token_ids)
        ids = torch.tensor([prompt], device=self.device)
        out = self.model(ids, use_cache=True)
        tokens, logprobs = [], []
        for _ in range(sampling.max_new_tokens):
            logits = out.logits[0, -1].float()
            tok, lp = _pick(logits, sampling, gen)
            tokens.append(tok)
            logprobs.append(lp)
            if tok in stops:
                return tokens, logprobs, True
            out = self.model(torch.tensor([[tok]], device=self.device), past_key_values=out.past_key_values,
                             use_cache=True)
        return tokens, logprobs, False

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], kernel_format: bool = False) -> None:
        """Full HF-named tensors (the ``gather`` sync mode; this backend has no other)."""
        if kernel_format:
            raise ValueError("the HF rollout backend loads full HF tensors only (rollout.weight_sync_mode=gather)")
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"HF rollout: weight {name!r} is not a parameter of the model")
            params[name].copy_(tensor)

    def sleep(self) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def _pick(logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator) -> tuple[int, float]:
    """Sample one token; return it and its log-prob under log_softmax(logits / T)."""
    if sampling.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits / sampling.temperature, -1)
    probs = logp.exp()
    if sampling.top_k > 0:
        kth = torch.topk(probs, min(sampling.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, order, keep)
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    tok = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
    return tok, float(logp[tok])
