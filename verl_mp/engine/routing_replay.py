"""Routing replay: force megatron's MoE routers onto given experts, and record their choices.

A batch's routing is ``routed_experts [B, S, L, k]`` (int16, positions of ``input_ids``, all
``L`` MoE layers, the ``k`` chosen experts of each token), ``-1`` where unknown (padding, the
last token of a sampled sequence, which the rollout never ran): such tokens route naturally.

megatron-core 0.16.1 routes through ``router.router_replay.get_replay_topk(scores, topk,
num_groups, group_topk, default_compute_topk)`` whenever ``router_replay`` is set
(`megatron/core/transformer/moe/moe_utils.py`, ``topk_routing_with_score_function``). Its
own ``RouterReplay`` keeps a class-wide list of instances (the actor's and the reference's
routers would share it) and appends every target to a backward list; `LayerReplay` is the
project's per-router stand-in with the same method: forced rows take the given experts and
their scores (softmax over the k, or the pre-softmax probabilities, exactly as for natural
routing), the others route naturally, and it records what was used when asked.

Token order: a router sees ``[s, b]`` flattened sequence-major, its sequence-parallel slice
under SP (`to_router_order`); recordings come back through the inverse (`from_router_order`),
are all-gathered over the TP group under SP, combined over pipeline stages (each stage has
its layers) and gathered over data-parallel ranks (`RoutingReplay.collect`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl_mp.engine.runtime import local_device

ROUTING_DTYPE = torch.int16
"""Expert indices up to 32767; -1 marks natural routing."""


class LayerReplay:
    """One router's replay state (see the module doc)."""

    def __init__(self):
        self.target: torch.Tensor | None = None
        """``[tokens, k]`` experts to use for the next forward, rows of -1 route naturally."""
        self.record = False
        self.recorded: list[torch.Tensor] = []
        """``[tokens, k]`` experts used, one per forward (micro-batch order)."""

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        probs, indices = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.target is not None:
            target = self.target.to(device=indices.device, dtype=indices.dtype)
            forced = (target >= 0).all(dim=1, keepdim=True)
            indices = torch.where(forced, target, indices)
            probs = scores.gather(1, indices)
        if self.record:
            self.recorded.append(indices.detach().to(ROUTING_DTYPE))
        return probs, indices


class RoutingReplay:
    """The replay state of every router of one engine on this rank."""

    def __init__(self, routers: list[tuple[int, torch.nn.Module]], num_layers: int, top_k: int, state,
                 sequence_parallel: bool):
        self.state, self.num_layers, self.top_k, self.sp = state, num_layers, top_k, sequence_parallel
        self.layers: dict[int, LayerReplay] = {}
        for layer, router in routers:
            router.router_replay = self.layers[layer] = LayerReplay()
        self.replaying = False

    def start(self, replay: bool, record: bool) -> None:
        """Before a forward or train step over the micro-batches."""
        self.replaying = replay
        for r in self.layers.values():
            r.target, r.record, r.recorded = None, record, []

    def stop(self) -> None:
        for r in self.layers.values():
            r.target, r.record, r.recorded = None, False, []
        self.replaying = False

    def on_forward(self, mb) -> None:
        """Before a micro-batch's forward: each router's target in its token order."""
        if not self.replaying:
            return
        routing = mb.tensors.get("routed_experts")
        if routing is None:
            raise ValueError("routing replay needs the batch's routed_experts [B, S, L, k]")
        ordered = to_router_order(mb, routing, self._sp_rank_size())  # [L, tokens, k]
        for layer, r in self.layers.items():
            r.target = ordered[layer]

    def _sp_rank_size(self) -> tuple[int, int]:
        return (self.state.tp_rank, self.state.tp_size) if self.sp else (0, 1)

    def collect(self, mbs: list, batch_shape: tuple[int, int]) -> torch.Tensor:
        """The recorded routing of the whole batch ``[B, S, L, k]`` on every rank (collective)."""
        from megatron.core import parallel_state as mps

        rows = torch.tensor_split(torch.arange(batch_shape[0]), self.state.dp_size)[self.state.dp_rank]
        # int32 while collectives run (gloo has no int16 reductions)
        local = torch.full((len(rows), batch_shape[1], self.num_layers, self.top_k), -1, dtype=torch.int32)
        layers = sorted(self.layers)
        for j, mb in enumerate(mbs):
            stacked = torch.stack([self.layers[layer].recorded[j] for layer in layers]) if layers else None
            if stacked is not None and self.sp and self.state.tp_size > 1:
                stacked = stacked.to(device=_device(), dtype=torch.int32)
                parts = [torch.empty_like(stacked) for _ in range(self.state.tp_size)]
                dist.all_gather(parts, stacked.contiguous(), group=self.state.tp_group)
                stacked = torch.cat(parts, dim=1)
            if mb.dummy or stacked is None:
                continue
            aligned = from_router_order(mb, stacked.cpu())  # [b, s, L_stage, k]
            cols = mb.starts[:, None] + torch.arange(aligned.shape[1])[None, :]
            keep = mb.valid.cpu()[:, :aligned.shape[1]] & (cols < batch_shape[1])
            row_index = mb.rows[:, None].expand_as(cols)[keep]
            block = local[row_index, cols[keep]]
            block[:, layers] = aligned[keep].to(block.dtype)
            local[row_index, cols[keep]] = block
        device = _device()
        local = local.to(device)
        if self.state.pp_size > 1:  # stages hold different layers; -1 elsewhere
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=mps.get_pipeline_model_parallel_group())
        full = _gather_rows(local, batch_shape[0], self.state.dp_size, mps.get_data_parallel_group())
        return full.cpu().to(ROUTING_DTYPE)


def to_router_order(mb, routing: torch.Tensor, sp: tuple[int, int]) -> torch.Tensor:
    """Aligned ``routing [b, s, L, k]`` of a micro-batch -> ``[L, tokens, k]`` in the routers'
    token order (model-input layout ``[rows, width]`` transposed and flattened, this rank's
    sequence-parallel slice), -1 off real tokens."""
    rows, width = mb.model_inputs["input_ids"].shape
    num_layers, k = routing.shape[2:]
    valid = mb.valid[:, : routing.shape[1]].to(routing.device)
    model = torch.full((rows, width, num_layers, k), -1, dtype=routing.dtype, device=routing.device)
    if mb.packed:
        real = routing[valid]  # [tokens, L, k] in row order: the packed layout
        model[0, : real.shape[0]] = real
    else:
        b, s = routing.shape[:2]
        model[:b, :s] = torch.where(valid[..., None, None], routing, torch.full_like(routing, -1))
    seq_major = model.transpose(0, 1)  # [width, rows, L, k]
    rank, size = sp
    seq_major = seq_major.chunk(size, dim=0)[rank]
    return seq_major.reshape(-1, num_layers, k).permute(1, 0, 2).contiguous()


def from_router_order(mb, stacked: torch.Tensor) -> torch.Tensor:
    """Inverse of `to_router_order` for recorded ``[L, tokens (all SP slices), k]`` -> aligned
    ``[b, s, L, k]`` (values off real tokens are not meaningful)."""
    rows, width = mb.model_inputs["input_ids"].shape
    num_layers, _, k = stacked.shape
    model = stacked.permute(1, 0, 2).reshape(width, rows, num_layers, k).transpose(0, 1)  # [rows, width, L, k]
    b, s = mb.valid.shape
    if mb.packed:
        out = torch.full((b, s, num_layers, k), -1, dtype=stacked.dtype)
        valid = mb.valid.cpu()
        out[valid] = model[0, : int(valid.sum())]
        return out
    return model[:b, :s]


def _gather_rows(local: torch.Tensor, batch_size: int, dp_size: int, group) -> torch.Tensor:
    """DP ranks' row blocks (``tensor_split`` sizes) -> ``[B, ...]`` on every rank."""
    if dp_size == 1:
        return local
    sizes = [len(r) for r in torch.tensor_split(torch.arange(batch_size), dp_size)]
    padded = torch.full((max(sizes), *local.shape[1:]), -1, dtype=local.dtype, device=local.device)
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(dp_size)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])


def _device() -> torch.device:
    return local_device()
