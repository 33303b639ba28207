"""The SGLang rollout engine (``rollout.backend=sglang``), behind the same interface as vLLM's.

SGLang's offline engine runs its model in scheduler processes of its own (one per TP rank),
not in the caller's process as vLLM's ``external_launcher`` does. So the world is grouped
into ``world // rollout_tp`` data-parallel groups as for vLLM, and the first rank of each
group (its leader) starts one ``sglang.Engine(tp_size=rollout_tp)`` whose schedulers take
the group's GPUs (``base_gpu_id`` = the leader's device). The other ranks hold no engine:
they take part in the weight sync's collectives and in the gather of the results.

- generate: the leader sends its group's share of the prompts, ``n`` requests per prompt,
  and reads the sampled ids and their log-probs (``return_logprob``: log-softmax after
  temperature, SGLang's default; with top-p < 1 or top-k the probabilities are not
  renormalised over the kept tokens, unlike vLLM's ``processed_logprobs``). Results are
  all-gathered, so every rank returns the same `RolloutOutput`.
- weight sync: the ``gather`` sync's HF-named full tensors (every rank consumes the stream in
  step), grouped by the leader into batches of ``rollout.weight_sync_bucket_mb`` and handed to
  ``Engine.update_weights_from_tensor`` (CUDA IPC into the schedulers, whose loaders take
  their TP slice); the radix cache is flushed with the last batch.
- sleep/wake: ``release_memory_occupation`` / ``resume_memory_occupation`` (the engine is
  started with ``enable_memory_saver``); level 1 keeps a CPU copy of the weights
  (``enable_weights_cpu_backup``), level 2 drops them and the next sync rewrites them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from verl_mp.config.rollout import RolloutConfig, SamplingConfig, validate_rollout_layout
from verl_mp.rollout.sglang_compat import check_sglang
from verl_mp.rollout.types import RolloutOutput

logger = logging.getLogger(__name__)

SGLANG_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_SLEEP_TAGS = {"weights": ("weights",), "kv_cache": ("kv_cache", "cuda_graph")}
"""The rollout interface's memory tags (vLLM's) -> SGLang's memory-saver tags."""


class SGLangRollout:
    def __init__(self, cfg: RolloutConfig, model_path: str, num_kv_heads: int, moe: bool = False,
                 max_positions: int | None = None):
        if moe:
            raise ValueError("rollout.backend=sglang is built and checked for dense models only (no MoE weight "
                             "layout or routing capture yet); use rollout.backend=vllm for mixture-of-experts models")
        if cfg.multi_turn.enable:
            raise ValueError("rollout.multi_turn.enable=true needs rollout.backend=vllm")
        self.version = check_sglang(cuda=torch.cuda.is_available())
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.dp_size = validate_rollout_layout(cfg, world, num_kv_heads)
        self.tp_size = cfg.tensor_model_parallel_size
        self.leader = self.rank % self.tp_size == 0
        self.cfg = cfg
        self.sleep_level = cfg.sleep_level or 2
        self.bucket_bytes = cfg.weight_sync_bucket_mb * 2**20
        self.engine = None
        if self.leader:
            import sglang

            t0 = time.perf_counter()
            logger.info("starting sglang.Engine %s (TP %d from GPU %d)", self.version, self.tp_size,
                        torch.cuda.current_device())
            kwargs = engine_kwargs(cfg, model_path, torch.cuda.current_device(), max_positions)
            if kwargs["context_length"] < cfg.max_model_len + CONTEXT_RESERVE:
                logger.warning("rollout.max_model_len=%d leaves SGLang no room for the %d tokens it reserves below the "
                               "model's max_position_embeddings=%s: a prompt within %d tokens of max_model_len - "
                               "max_new_tokens gets that many fewer response tokens", cfg.max_model_len,
                               CONTEXT_RESERVE, max_positions, CONTEXT_RESERVE)
            with engine_start_env():
                self.engine = sglang.Engine(**kwargs)
            logger.info("sglang.Engine up in %.1f s", time.perf_counter() - t0)
        if dist.is_initialized():
            dist.barrier()  # every group's engine is up before any rank moves on
        self._sleeping: set[str] = set()
        self._seed_warned = False
        self.weights_dropped = False
        """A level-2 sleep dropped the weights and no sync has written them since."""

    # -- generation -------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 record_routing: bool = False, carry=None) -> RolloutOutput:
        if carry is not None:  # check_multi_turn refuses multi-turn (and so carry-over) first
            raise ValueError("rollout.multi_turn.carry_over needs rollout.backend=vllm")
        if record_routing:
            raise ValueError("routing capture needs rollout.backend=vllm")
        if self.weights_dropped:
            raise RuntimeError("SGLang's weights were dropped by a level-2 sleep (rollout.sleep_level=2) and no "
                               "weight sync has written them since: sync (load_weights) first")
        if sampling.seed is not None and not self.cfg.sglang_deterministic and not self._seed_warned:
            self._seed_warned = True
            logger.warning("rollout.sampling.seed=%d has no effect with rollout.backend=sglang unless "
                           "rollout.sglang_deterministic=true (SGLang honours per-request seeds only there)", sampling.seed)
        mine = list(range(self.rank // self.tp_size, len(prompt_ids), self.dp_size))
        local: dict[int, list[tuple]] = {}
        if self.leader and mine:
            input_ids, params = request_batch(prompt_ids, mine, sampling)
            outs = self.engine.generate(input_ids=input_ids, sampling_params=params,
                                        return_logprob=sampling.logprobs)
            local = unpack_outputs(outs, mine, sampling)
        merged = self._gather(local)
        flat = [s for i in range(len(prompt_ids)) for s in merged[i]]
        return RolloutOutput(prompt_ids=[list(p) for p in prompt_ids], response_ids=[s[0] for s in flat],
                             response_logprobs=[s[1] for s in flat] if sampling.logprobs else None,
                             n=sampling.n, finished=[s[2] for s in flat])

    def _gather(self, local: dict) -> dict:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return local
        everything: list = [None] * dist.get_world_size()
        dist.all_gather_object(everything, local if self.leader else {})
        merged: dict = {}
        for part in everything:
            merged.update(part)
        return merged

    # -- weights and memory -------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], kernel_format: bool = False) -> None:
        """HF-named full tensors (the ``gather`` sync). Every rank consumes ``weights`` (its
        collectives run in step); the leader hands them to SGLang batch by batch."""
        if kernel_format:
            raise ValueError("the SGLang rollout backend loads full HF tensors only (rollout.weight_sync_mode=gather)")
        batches = weight_batches(weights, self.bucket_bytes)
        last = None
        for batch in batches:
            if self.leader and last is not None:
                self._update(last, flush_cache=False)
            last = batch
        if self.leader and last is not None:
            self._update(last, flush_cache=True)  # cached prefixes are stale now
        self.weights_dropped = False

    def _update(self, batch: list[tuple[str, torch.Tensor]], flush_cache: bool) -> None:
        """One ``update_weights_from_tensor`` call; SGLang answers ``(success, message)`` and keeps
        its old weights when it fails, so a failure stops the run here."""
        check_update(self.engine.update_weights_from_tensor(batch, flush_cache=flush_cache), batch)

    def sleep(self) -> None:
        """Release SGLang's GPU memory: the KV cache and CUDA graphs, and the weights unless
        ``rollout.keep_weights_on_gpu`` (level 1 backs them up on the CPU, level 2 drops them)."""
        wanted = ["kv_cache"] if self.cfg.keep_weights_on_gpu else ["weights", "kv_cache"]
        tags = [t for t in wanted if t not in self._sleeping]
        if not tags:
            return
        if self.leader:
            self.engine.release_memory_occupation(tags=[s for t in tags for s in _SLEEP_TAGS[t]])
        self._sleeping |= set(tags)
        self.weights_dropped = self.weights_dropped or ("weights" in tags and self.sleep_level == 2)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Resume what is released of ``tags`` (all by default; ``["weights"]`` before a sync)."""
        wanted = [t for t in ("weights", "kv_cache") if t in self._sleeping and (tags is None or t in tags)]
        if not wanted:
            return
        if self.leader:
            self.engine.resume_memory_occupation(tags=[s for t in wanted for s in _SLEEP_TAGS[t]])
        self._sleeping -= set(wanted)

    def close(self) -> None:
        """Shut the engine down. SGLang's shutdown kills every child of this process and raises
        when one is not reaped within 60 s: logged, so that a finished run does not end as a
        failure at its very end."""
        if self.engine is not None:
            engine, self.engine = self.engine, None
            try:
                engine.shutdown()
            except Exception as e:  # noqa: BLE001 - the run's work is done; say what failed
                logger.error("sglang.Engine.shutdown failed (%s: %s); its processes may outlive the run",
                             type(e).__name__, e)


CONTEXT_RESERVE = 2
"""Tokens of ``context_length`` SGLang 0.5.17 never generates into: its requests end at
``context_length - 1`` tokens and its scheduler caps ``max_new_tokens`` one below that
(``tp_worker.py``, ``scheduler.py``). The engine gets ``max_model_len`` plus these, so that a
prompt and ``max_new_tokens`` fit exactly where they fit vLLM (``rollout.max_model_len``)."""


def engine_kwargs(cfg: RolloutConfig, model_path: str, device_index: int, max_positions: int | None = None) -> dict:
    """``sglang.Engine`` arguments for ``cfg`` (pure: no SGLang import). ``max_positions``: the
    model's ``max_position_embeddings``, which the context (``max_model_len`` +
    `CONTEXT_RESERVE`) does not pass (SGLang refuses a longer one)."""
    context = cfg.max_model_len + CONTEXT_RESERVE
    if max_positions is not None:
        context = max(cfg.max_model_len, min(context, max_positions))
    kwargs = dict(
        model_path=model_path,
        tp_size=cfg.tensor_model_parallel_size,
        base_gpu_id=device_index,
        dtype=SGLANG_DTYPES[cfg.dtype],
        context_length=context,
        mem_fraction_static=cfg.gpu_memory_utilization,
        load_format=cfg.load_format,
        enable_memory_saver=True,
        enable_weights_cpu_backup=(cfg.sleep_level or 2) == 1,
        disable_cuda_graph=bool(cfg.enforce_eager),
        skip_tokenizer_init=True,  # token ids in and out
        random_seed=0,
        port=_free_port(),  # one engine per data-parallel group, several per node
        log_level="error",
    )
    if cfg.cudagraph_max_tokens and not cfg.enforce_eager:  # its decode graphs' largest batch (sequences)
        kwargs["cuda_graph_max_bs_decode"] = cfg.cudagraph_max_tokens
    if cfg.sglang_attention_backend is not None:
        kwargs["attention_backend"] = cfg.sglang_attention_backend
    if cfg.sglang_deterministic:
        # per-request seeds are honoured only in SGLang's deterministic mode, and only by its torch sampler
        kwargs.update(enable_deterministic_inference=True, sampling_backend="pytorch")
    return kwargs


_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


@contextlib.contextmanager
def engine_start_env():
    """Around ``sglang.Engine(...)`` in a trainer rank, two things its start-up would break:

    - its scheduler processes are spawned without torchrun's ``TORCHELASTIC_USE_AGENT_STORE``.
      A child that inherits it joins every ``tcp://`` rendezvous as a client of a store nobody
      serves, so the schedulers' own process group never forms and the engine waits without a
      word until the rendezvous times out (seen on the GPU machine, 2026-12-06: a 480 s silent
      hang under torchrun; a bare engine started in 76 s);
    - the rank's logging is put back: the engine's start calls ``logging.basicConfig(level=ERROR,
      force=True)`` in the calling process (sglang 0.5.17's ``configure_logger``), which would drop
      every INFO and WARNING line of the rank from then on (its progress and warnings)."""
    saved = os.environ.pop(_AGENT_STORE, None)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        if saved is not None:
            os.environ[_AGENT_STORE] = saved
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def request_batch(prompt_ids: list[list[int]], mine: list[int],
                  sampling: SamplingConfig) -> tuple[list[list[int]], list[dict]]:
    """One SGLang request per sample, prompt-major (``n`` per prompt of ``mine``). Sample ``j``
    of prompt ``i`` is seeded ``seed + i * n + j``: its own seed whatever the rollout layout
    (both ``seed_scope`` values; SGLang has no per-call engine RNG to seed)."""
    input_ids, params = [], []
    for i in mine:
        for j in range(sampling.n):
            input_ids.append(list(prompt_ids[i]))
            params.append(sampling_params(sampling, None if sampling.seed is None else sampling.seed + i * sampling.n + j))
    return input_ids, params


def sampling_params(sampling: SamplingConfig, seed: int | None) -> dict:
    """SGLang's ``sampling_params`` for one sample of ``sampling``."""
    params = dict(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,  # -1: the whole vocabulary
        max_new_tokens=sampling.max_new_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=sampling.ignore_eos,
        no_stop_trim=True,  # keep the stop token in the response, as vLLM does
    )
    if seed is not None:
        params["sampling_seed"] = seed
    return params


def unpack_outputs(outs: list[dict], mine: list[int], sampling: SamplingConfig) -> dict[int, list[tuple]]:
    """``{prompt index: [(response ids, log-probs or None, finished)] * n}`` from the engine's
    outputs (one dict per request, in request order)."""
    if len(outs) != len(mine) * sampling.n:
        raise RuntimeError(f"SGLang returned {len(outs)} outputs for {len(mine) * sampling.n} requests")
    local: dict[int, list[tuple]] = {}
    for k, out in enumerate(outs):
        ids = list(out["output_ids"])
        meta = out["meta_info"]
        lps = None
        if sampling.logprobs:
            lps = [float(entry[0]) for entry in meta["output_token_logprobs"]]
            if len(lps) != len(ids):
                raise RuntimeError(f"SGLang returned {len(lps)} log-probs for {len(ids)} tokens")
        reason = meta.get("finish_reason") or {}
        local.setdefault(mine[k // sampling.n], []).append((ids, lps, reason.get("type") == "stop"))
    return local


def check_update(result, batch: list[tuple[str, torch.Tensor]]) -> None:
    """Raise unless ``update_weights_from_tensor``'s ``result`` (``(success, message)``) is a success."""
    ok, message = result
    if not ok:
        names = [name for name, _ in batch]
        raise RuntimeError(f"SGLang refused the weight update of {len(names)} tensors ({names[0]} ... {names[-1]}): "
                           f"{message or 'no message'}; its old weights are still in place, so the rollout would "
                           f"sample from the previous policy")


def weight_batches(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``weights`` in consecutive batches of at least ``bucket_bytes`` (the last may be smaller;
    a tensor is never split): one ``update_weights_from_tensor`` call each."""
    batch, size = [], 0
    for name, tensor in weights:
        batch.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

