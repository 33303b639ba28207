"""MegatronEngine: one model (actor, reference policy or critic) on this rank's TP/PP shard.

Runs under plain torchrun (no Ray). All ranks call every method with the *same full batch*
(``[B, S]`` tensors); the engine takes its data-parallel slice (``torch.tensor_split`` of the
rows), micro-batches it (`verl_mp.engine.batching`), runs megatron's pipeline schedule, and
returns outputs gathered to the full ``[B, S]`` on **every** rank (on the rank's device:
its GPU, or the CPU).

Alignment (same as HF ``logits[:, :-1]`` against ``input_ids[:, 1:]``):

- ``log_probs[:, t] = log p(input_ids[:, t+1] | input_ids[:, :t+1])`` (after temperature);
  ``entropy[:, t]`` is the entropy of that same distribution. Both are 0 where ``t`` or
  ``t+1`` is padding, and in the last column.
- ``values[:, t]`` is the critic's value after reading ``input_ids[:, :t+1]``; 0 on padding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.engine import batching, checkpoint, hf_weights, model, offload, schedule
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.logprobs import vocab_parallel_log_probs
from verl_mp.engine.moe import MoERuntime
from verl_mp.engine.optimizer import build_optimizer
from verl_mp.engine.runtime import ensure_parallel, local_device
from verl_mp.models.hf_checkpoint import open_hf_checkpoint
from verl_mp.models.layer_spec import resolve_backend
from verl_mp.models.routing import check_routed_experts
from verl_mp.utils.fs import fsync_tree

logger = logging.getLogger(__name__)

EngineLossFn = Callable[[dict, dict], tuple[torch.Tensor, dict]]
"""``loss_fn(outputs, micro_batch) -> (loss, metrics)``; see `MegatronEngine.train_step`."""


class MegatronEngine:
    """One role's model on this rank (see the module doc and docs/engine.md).

    Construction validates the HF checkpoint and the layout, starts (or reuses) megatron's
    parallel groups and builds the model (plus DDP and optimizer unless ``role="ref"``);
    weights come from `load_hf` or `load_checkpoint`.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        # Validates config and safetensors headers before anything is built.
        self.hf = open_hf_checkpoint(config.model_path, value_head=config.role == "critic", config_only=True)
        self.spec = self.hf.spec
        self.state = ensure_parallel(config.parallel, self.spec.shape, seed=config.seed, trainable=config.trainable)
        self.backend = resolve_backend(config.attention_backend)
        if config.remove_padding and self.backend == "local":
            raise ValueError("engine.remove_padding=True needs attention_backend 'sdpa' or 'te'")
        self.tf_config = model.transformer_config(
            self.spec, config.parallel, config.dtype, moe=config.moe, swiglu_module=self.backend == "sdpa",
            **model.recompute_settings(config.recompute, config.recompute_modules, config.recompute_num_layers))
        chunks = model.build_gpt_chunks(self.spec, self.tf_config, self.state, backend=self.backend,
                                         grouped_experts=config.moe.grouped_gemm)
        self.moe = MoERuntime(self.spec, config.moe, self.tf_config, chunks, self.state) if self.spec.moe else None
        self.optimizer = self.scheduler = None
        if config.trainable:
            chunks = model.wrap_ddp(chunks, self.tf_config, config.optim.use_distributed_optimizer)
            self.optimizer, self.scheduler = build_optimizer(chunks, config.optim, config.dtype,
                                                             config.total_training_steps)
        else:
            for chunk in chunks:
                chunk.requires_grad_(False)
        self.chunks = chunks
        self._offloader = offload.StorageOffloader()
        self.recorded_routing: torch.Tensor | None = None
        """``[B, S, L, k]`` int16: the experts every token used in the last pass run with
        ``record_routing`` (-1 off real tokens); MoE engines only."""

    # ----------------------------------------------------------------- weights
    def load_hf(self, path: str | None = None) -> None:
        """Load HF safetensors (default: ``config.model_path``); each rank reads its slices."""
        ckpt = self.hf if path is None else open_hf_checkpoint(path, value_head=self.spec.value_head)
        if not ckpt.has_weights:
            raise FileNotFoundError(f"{ckpt.path} has no safetensors weights to load")
        if ckpt.spec != self.spec:
            raise ValueError(f"{ckpt.path}/config.json describes a different model than {self.hf.path}")
        self._require_onloaded()
        hf_weights.load_hf_weights(self.chunks, ckpt, self.state)
        if self.optimizer is not None:
            self.optimizer.reload_model_params()

    def export_hf(self, path: str, dtype: torch.dtype | None = None, max_shard_bytes: int = 2 << 30) -> None:
        """Write an HF checkpoint (safetensors shards + index + config + tokenizer files).

        ``dtype`` defaults to the source checkpoint's dtype (so an fp32 engine exports a
        bf16 checkpoint as bf16). Collective over all ranks.
        """
        self._require_onloaded()
        dtype = dtype or self._source_dtype()
        hf_weights.export_hf_weights(self.chunks, self.spec, self.state, path, dtype=dtype,
                                     source_dir=self.hf.path, max_shard_bytes=max_shard_bytes)

    # ----------------------------------------------------------------- forward
    def compute_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                          temperature: float = 1.0, with_entropy: bool = False,
                          routed_experts: torch.Tensor | None = None, record_routing: bool = False):
        """``[B, S]`` ids and mask -> ``log_probs [B, S]`` fp32, or ``(log_probs, entropy)``.

        Vocab-parallel (never gathers the vocabulary); padded vocabulary rows are excluded.
        Mixture-of-experts engines: ``routed_experts [B, S, L, k]`` (-1: natural) forces the
        routing (`verl_mp.engine.routing_replay`); ``record_routing`` leaves the routing used
        in `recorded_routing`.
        """
        if self.spec.value_head:
            raise ValueError("compute_log_probs needs role actor/ref; this engine is a critic")
        keys = ("log_probs", "entropy") if with_entropy else ("log_probs",)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if routed_experts is not None:
            batch["routed_experts"] = routed_experts
        outs = self._forward_only(batch, keys, temperature, record_routing)
        return (outs["log_probs"], outs["entropy"]) if with_entropy else outs["log_probs"]

    def compute_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, S]`` ids and mask -> ``values [B, S]`` fp32 (critic only)."""
        if not self.spec.value_head:
            raise ValueError("compute_values needs role=critic")
        return self._forward_only({"input_ids": input_ids, "attention_mask": attention_mask}, ("values",), 1.0)["values"]

    def _heads(self, output: torch.Tensor, mb: batching.MicroBatch, temperature: float,
               with_entropy: bool) -> dict:
        """Model output of one micro-batch -> aligned ``[b, s]`` per-token tensors."""
        output = mb.crop(output)
        if self.spec.value_head:
            return {"values": mb.unpack(output.squeeze(-1).float())}
        log_probs, entropy = vocab_parallel_log_probs(
            output, mb.targets, vocab_size=self.spec.vocab_size, temperature=temperature,
            with_entropy=with_entropy)
        outs = {"log_probs": mb.unpack(log_probs, next_token=True)}
        if entropy is not None:
            outs["entropy"] = mb.unpack(entropy, next_token=True)
        return outs

    def _forward_only(self, batch: dict, keys, temperature, record_routing: bool = False) -> dict:
        self._require_onloaded()
        input_ids = batch["input_ids"]
        mbs = self._micro_batches(batch)

        def collect(output, batch):
            if batch["_mb"].dummy:
                return output.new_zeros(()), {}
            heads = self._heads(output, batch["_mb"], temperature, "entropy" in keys)
            return output.new_zeros(()), heads

        for chunk in self.chunks:
            chunk.eval()
        self._start_routing(batch, record_routing)
        try:
            with torch.no_grad():
                results = schedule.forward_backward(self.chunks, [m.model_inputs | {"_mb": m} for m in mbs],
                                                    collect, forward_only=True,
                                                    on_forward=self.moe.on_forward if self.moe else None)
            self._finish_routing(mbs, tuple(input_ids.shape), record_routing)
        finally:
            if self.moe is not None:
                self.moe.replay.stop()
        return {k: self._gather(mbs, results, k, input_ids.shape) for k in keys}

    def _start_routing(self, batch: Mapping[str, torch.Tensor], record: bool) -> None:
        replay = "routed_experts" in batch
        if self.moe is None:
            if replay or record:
                raise ValueError("routing replay/recording needs a mixture-of-experts model")
            return
        if replay:
            routing, ids = batch["routed_experts"], batch["input_ids"]
            if routing.dim() != 4 or tuple(routing.shape) != (*ids.shape, self.spec.num_layers, self.spec.moe.top_k):
                raise ValueError(f"routed_experts {list(routing.shape)} must be [B, S, num_layers, top_k] = "
                                 f"{[*ids.shape, self.spec.num_layers, self.spec.moe.top_k]}")
            check_routed_experts(routing, num_experts=self.spec.moe.num_experts, top_k=self.spec.moe.top_k,
                                 where="the routed_experts to replay")
        self.moe.replay.start(replay=replay, record=record)

    def _finish_routing(self, mbs, shape: tuple[int, int], record: bool) -> None:
        if record:
            self.recorded_routing = self.moe.replay.collect(mbs, shape)

    # ----------------------------------------------------------------- training
    def train_step(self, batch: Mapping[str, torch.Tensor], loss_fn: EngineLossFn, *,
                   temperature: float = 1.0, with_entropy: bool = False,
                   record_routing: bool = False) -> dict[str, float]:
        """One optimizer step on the full ``batch`` (every rank passes the same one).

        ``batch`` holds ``input_ids`` and ``attention_mask`` ``[B, S]`` plus any tensors the
        loss needs, each ``[B, S, ...]`` (per token) or ``[B, ...]`` (per row). For every
        micro-batch, ``loss_fn(outputs, micro_batch)`` gets ``outputs`` = ``{"log_probs",
        "entropy" (if with_entropy)}`` for actors or ``{"values"}`` for critics, each ``[b, s]``,
        and ``micro_batch`` = the batch's tensors for the same rows in the same aligned
        ``[b, s]`` layout. It returns ``(loss, metrics)`` where the loss is already normalised
        by *global* counts over the full batch (computed by the caller from the full
        batch, e.g. ``global_num_tokens = response_mask.sum()``): gradients are summed
        over micro-batches and DP ranks (`verl_mp.engine.schedule`). Returns the reduced
        metrics plus ``grad_norm``, ``lr`` and ``update_skipped``.

        Mixture-of-experts engines: a ``routed_experts [B, S, L, k]`` entry replays that
        routing; ``record_routing`` keeps the routing of the step's forwards in
        `recorded_routing` (not with activation recompute, which runs the routers twice).
        """
        if not self.config.trainable:
            raise ValueError("train_step needs role actor or critic; this engine is a reference policy")
        self._require_onloaded()
        mbs = self._micro_batches(batch)

        def wrapped(output, mb_dict):
            mb = mb_dict["_mb"]
            if mb.dummy:  # runs only for the MoE layers' collectives; adds nothing
                return output.sum() * 0.0, {}
            return loss_fn(self._heads(output, mb, temperature, with_entropy), mb.tensors)

        for chunk in self.chunks:
            chunk.train()
        if record_routing and self.config.recompute != "none":
            raise ValueError("record_routing in train_step needs engine.recompute='none' (recompute re-runs "
                             "the routers)")
        self._start_routing(batch, record_routing)
        try:
            if self.moe is not None:
                self.moe.start_step(batch["attention_mask"])
            metrics = schedule.train_step(self.chunks, self.optimizer, self.scheduler,
                                          [m.model_inputs | {"_mb": m} for m in mbs], wrapped, self.state,
                                          on_forward=self.moe.on_forward if self.moe else None)
            if self.moe is not None:
                metrics.update(self.moe.end_step())
            self._finish_routing(mbs, tuple(batch["input_ids"].shape), record_routing)
        finally:
            if self.moe is not None:
                self.moe.replay.stop()
        return metrics

    # ----------------------------------------------------------------- batching
    def _dp_rows(self, batch_size: int) -> torch.Tensor:
        if batch_size < self.state.dp_size:
            raise ValueError(f"batch of {batch_size} rows is smaller than the data-parallel size "
                             f"{self.state.dp_size}; use a larger batch")
        return torch.tensor_split(torch.arange(batch_size), self.state.dp_size)[self.state.dp_rank]

    def _micro_batches(self, batch: Mapping[str, torch.Tensor]) -> list[batching.MicroBatch]:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if ids.dim() != 2 or tuple(mask.shape) != tuple(ids.shape):
            raise ValueError(f"input_ids {list(ids.shape)} and attention_mask {list(mask.shape)} "
                             f"must both be [B, S]")
        rows = self._dp_rows(ids.shape[0])
        # Planned on the CPU; each micro-batch then moves to the device (MicroBatch.to).
        local = {k: v[rows.to(v.device)].cpu() for k, v in batch.items()}
        starts, lengths = batching.row_spans(local["attention_mask"])
        cfg = self.config
        groups = batching.plan_micro_batches(lengths.tolist(), micro_batch_size=cfg.micro_batch_size,
                                             max_tokens=cfg.max_tokens_per_micro_batch, packed=cfg.remove_padding)
        pad_to = self.state.tp_size if cfg.parallel.sequence_parallel else 1
        mbs = [batching.build_micro_batch(local["input_ids"], starts, lengths, g, packed=cfg.remove_padding,
                                          pad_to=pad_to, extra=local) for g in groups]
        if self.moe is not None:
            mbs = self.moe.align(mbs)
        device = local_device()
        return [mb.to(device) for mb in mbs]

    def _gather(self, mbs, results, key: str, shape) -> torch.Tensor:
        """Per-micro-batch outputs of the last stage -> ``[B, S]`` on every rank."""
        from megatron.core import parallel_state as mps

        rows = self._dp_rows(shape[0])
        local = torch.zeros(len(rows), shape[1], dtype=torch.float32)
        if self.state.is_last_stage:
            for mb, res in zip(mbs, results, strict=True):
                if not mb.dummy:
                    batching.scatter_rows(local, mb, res[key])
        local = local.to(local_device())
        full = torch.zeros(tuple(shape), dtype=torch.float32, device=local.device)
        if self.state.is_last_stage:
            full = _all_gather_rows(local, shape, self.state.dp_size, mps.get_data_parallel_group())
        if self.state.pp_size > 1:
            dist.broadcast(full, src=mps.get_pipeline_model_parallel_last_rank(),
                           group=mps.get_pipeline_model_parallel_group())
        return full

    # ----------------------------------------------------------------- state
    def save_checkpoint(self, directory: str) -> None:
        """megatron dist checkpoint: model, optimizer, scheduler, RNG (loadable at any TP/PP).

        The HF config and tokenizer files go to ``directory/hf`` so the checkpoint converts
        back to HF (``verl-mp convert megatron-to-hf``) on its own.
        """
        self._require_onloaded()
        checkpoint.save_training_state(self.chunks, self.optimizer, self.scheduler, self.state, directory,
                                       extra={"role": self.config.role, "architecture": self.spec.architecture})
        if dist.get_rank() == 0:
            hf_dir = Path(directory) / "hf"
            hf_dir.mkdir(exist_ok=True)
            hf_weights.copy_config_and_tokenizer(self.hf.path, hf_dir, self.spec, self._source_dtype())
            fsync_tree(str(hf_dir))  # by its writer (the checkpoint is published by another process)
        dist.barrier()

    def _source_dtype(self) -> torch.dtype:
        return hf_weights.DTYPE_NAMES.get(self.hf.torch_dtype or "", self.tf_config.params_dtype)

    def load_checkpoint(self, directory: str) -> None:
        """Load `save_checkpoint`'s output (saved at any TP/PP); a ref engine loads only the model."""
        self._require_onloaded()
        saved_role = checkpoint.read_meta(directory).get("role")
        if (saved_role == "critic") != self.spec.value_head:
            raise ValueError(f"{directory} holds a {saved_role} checkpoint; this engine is a {self.config.role}")
        checkpoint.load_training_state(self.chunks, self.optimizer, self.scheduler, self.state, directory)

    def offload(self, *, params: bool | None = None, grads: bool | None = None,
                optimizer: bool | None = None) -> int:
        """Move the selected state off the device (defaults: the config's ``offload``)."""
        cfg = self.config
        tensors = []
        if cfg.offload.params if params is None else params:
            tensors += offload.param_tensors(self.chunks)
        if self.config.trainable and (cfg.offload.grads if grads is None else grads):
            tensors += offload.grad_buffer_tensors(self.chunks)
        if self.optimizer is not None and (cfg.offload.optimizer if optimizer is None else optimizer):
            tensors += offload.optimizer_tensors(self.optimizer)
        freed = self._offloader.offload(tensors)
        logger.debug("offloaded %.1f MiB", freed / 2**20)
        return freed

    def onload(self) -> None:
        self._offloader.onload()

    @property
    def offloaded(self) -> bool:
        """True while some of this engine's state is off the device."""
        return self._offloader.offloaded

    def _require_onloaded(self) -> None:
        if self._offloader.offloaded:
            raise RuntimeError("engine state is offloaded; call engine.onload() first")


def _all_gather_rows(local: torch.Tensor, shape, dp_size: int, group) -> torch.Tensor:
    """Concatenate DP ranks' row blocks (``tensor_split`` sizes) into ``[B, S]``."""
    if dp_size == 1:
        return local
    sizes = [len(r) for r in torch.tensor_split(torch.arange(shape[0]), dp_size)]
    padded = torch.zeros(max(sizes), shape[1], dtype=local.dtype, device=local.device)
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(dp_size)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])
