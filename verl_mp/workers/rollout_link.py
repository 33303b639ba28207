"""The two ends of a rollout on ranks of its own (``trainer.placement.roles.rollout``).

The actor group keeps a gather-mode `WeightSync` (full HF tensors on every actor rank, no
rollout engine in its processes); the rollout group hosts vLLM alone, at its own TP.
After each update the actor's rank 0 broadcasts the weights to every rollout rank over a
`verl_mp.bridge.transport.WeightChannel`, and each rollout rank reloads them in place.
`RankWorker` calls these helpers; they hold no state of their own.
"""

from __future__ import annotations

import torch.distributed as dist

from verl_mp.bridge.transport import Manifest, TransferStats, WeightChannel, drain, receive, send
from verl_mp.bridge.weight_sync import WeightSync
from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.plan import RunPlan


def actor_sync(plan: RunPlan, actor) -> WeightSync:
    """The actor side's generator of full HF tensors (bucketed TP gathers and PP broadcasts)."""
    return WeightSync(actor.spec, actor.chunks, actor.state, plan.rollout.weight_sync_bucket_mb, "gather")


def model_spec(model_path: str):
    """The model's `GPTSpec`, read from its config.json (a rollout rank has no engine to ask:
    its KV heads bound the rollout's TP; a mixture-of-experts model needs vLLM's expert
    reload)."""
    from transformers import AutoConfig

    return spec_from_hf_config(AutoConfig.from_pretrained(model_path))


def open_channel(plan: RunPlan, sync: WeightSync | None, host: str, port: int) -> WeightChannel | None:
    """Join the weight channel: the actor's rank 0 as sender (it publishes the manifest),
    every rollout rank as a receiver; other actor ranks are not members (None)."""
    receivers = plan.groups[plan.group_of("rollout")].world_size
    rank = dist.get_rank()
    if sync is not None and rank != 0:
        return None
    channel = WeightChannel.open(host, port, 0 if sync is not None else 1 + rank, 1 + receivers)
    channel.agree(Manifest.plan(sync.planned_shapes(), sync.dtype, sync.bucket_bytes) if sync is not None else None)
    return channel


def send_weights(sync: WeightSync, channel: WeightChannel | None) -> dict[str, float]:
    """Actor ranks: run the sync (collective in the actor group); rank 0 sends every bucket."""
    if channel is None:
        drain(sync.iter_weights())
        return {}
    stats = TransferStats()
    send(channel, sync.iter_weights(), stats)
    s = sync.last_stats
    return {**stats.metrics("rollout/send"), "rollout/sync_bytes": float(s.bytes_synced),
            "rollout/sync_tp_gathered_bytes": float(s.tp_gathered_bytes),
            "rollout/sync_gbps": stats.bytes / max(stats.seconds, 1e-9) / 1e9, "rollout/sync_local": 0.0}


def receive_weights(rollout, channel: WeightChannel) -> dict[str, float]:
    """Rollout ranks: receive every bucket and reload it into vLLM in place."""
    stats = TransferStats()
    rollout.wake_up(["weights"])
    rollout.load_weights(receive(channel, stats), kernel_format=False)
    return stats.metrics("rollout/receive")
