"""What a routing table may hold: the checks for routed experts read from outside the engine.

Routing replay forces the actor's routers onto given experts (`verl_mp.engine.routing_replay`).
The ids come from the rollout engine's capture, from a checkpoint's
``rollout_routing.safetensors`` or from the engine's own recording; an id outside
``[0, num_experts)`` would index past the expert weights (on a GPU: a device-side assert or
silently wrong rows), and a token given the same expert twice is not a top-k routing. Every
such table is checked here before it is used, by value, not only by shape.
"""

from __future__ import annotations

import torch

NATURAL = -1
"""The id of a token that routes naturally (padding, a position the rollout never ran)."""


def check_routed_experts(routing: torch.Tensor, *, num_experts: int | None, top_k: int | None,
                         num_layers: int | None = None, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``routing [..., L, k]`` holds integer expert
    ids where each token's ``k`` ids in a layer are all ``-1`` (natural routing) or ``k``
    distinct ids in ``[0, num_experts)``. ``None`` skips that part of the check."""
    if routing.dtype.is_floating_point or routing.dtype.is_complex or routing.dtype == torch.bool:
        raise ValueError(f"{where}: routed experts must be integer expert ids, not {routing.dtype}")
    if routing.dim() < 2:
        raise ValueError(f"{where}: routed experts of shape {list(routing.shape)} must be [..., layers, top_k]")
    if top_k is not None and routing.shape[-1] != top_k:
        raise ValueError(f"{where}: {routing.shape[-1]} experts per token, the model routes to top_k={top_k}")
    if num_layers is not None and routing.shape[-2] != num_layers:
        raise ValueError(f"{where}: routing for {routing.shape[-2]} layers, the model has {num_layers}")
    k = routing.shape[-1]
    flat = routing.reshape(-1, k).to(torch.int64)
    natural = (flat == NATURAL).all(dim=1)
    in_range = (flat >= 0).all(dim=1) & ((flat < num_experts).all(dim=1) if num_experts is not None else True)
    bad = ~(natural | in_range)
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        bound = f"[0, {num_experts})" if num_experts is not None else "0 or more"
        raise ValueError(f"{where}: expert ids must be {bound}, or -1 for all of a token's experts (natural "
                         f"routing); {_position(routing.shape, at)} holds {flat[at].tolist()}. The table is corrupt "
                         "or belongs to another model")
    if k > 1:
        ids = flat[in_range].sort(dim=1).values
        repeated = (ids[:, 1:] == ids[:, :-1]).any(dim=1)
        if bool(repeated.any()):
            at = int(in_range.nonzero()[repeated.nonzero()[0, 0], 0])
            raise ValueError(f"{where}: a token's top-{k} experts must be distinct; {_position(routing.shape, at)} "
                             f"holds {flat[at].tolist()}. The table is corrupt")


def _position(shape: torch.Size, row: int) -> str:
    """``token (i, j), layer l`` of the ``row``-th ``[k]`` row of a ``[..., L, k]`` table."""
    index = []
    for size in reversed(shape[:-1]):
        index.append(row % size)
        row //= size
    *token, layer = reversed(index)
    return f"token {tuple(token) if len(token) != 1 else token[0]}, layer {layer},"
