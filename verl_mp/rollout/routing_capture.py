"""Record which experts vLLM's MoE routers chose for every token it generated from.

For routing replay (``actor.router_replay=rollout``) the trainer needs, for every sampled
sequence, each position's ``k`` experts in each MoE layer. vLLM's own
``enable_return_routed_experts`` needs its Model Runner V2 in vLLM 0.32 (GPU only), so by
default (``rollout.routing_capture=hooks``) the project records them itself, inside the
in-process vLLM worker; with ``rollout.routing_capture=vllm`` (vLLM 0.26's GPU runner) vLLM
returns them with each output and `routing_from_vllm` brings them to the same layout.
The hooks:

- each fused-MoE layer's router gets a capture callback (``MoERunner.router.set_capture_fn``,
  the hook vLLM's own capturer uses): it receives the step's ``topk_ids [tokens, k]``
  (logical expert ids, before any expert-placement mapping);
- a forward hook on the model reads, after each step, which rows belong to which request
  (the model runner's ``input_batch.req_ids`` and ``query_start_loc``) and each row's token
  and position, and files the rows under their request.

Requests are matched to the finished sequences by their tokens: a sequence
``prompt + response`` was run through the model at positions ``0 .. len - 2`` (the last
sampled token never is, except after an extra step of vLLM's async scheduling: `routing_for`),
so the recorded token sequence of its request is ``(prompt + response)[:-1]``; identical
sequences route identically. Every position must
have been run by its own request, so a rollout that records turns vLLM's prefix cache off
for the whole run (`verl_mp.rollout.vllm_rollout.VLLMRollout`), and CUDA graphs too
(callbacks do not run inside a replayed graph).
"""

from __future__ import annotations

import torch

CAPTURE_DTYPE = torch.int16


class RoutingRecorder:
    """Installed once on a vLLM worker's model; records while ``active``."""

    def __init__(self, worker):
        self.runner = worker.model_runner
        model = self.runner.get_model()
        self.layers = self._bind(model)
        self.num_layers = max(int(self.runner.model_config.hf_config.num_hidden_layers), self.layers[-1] + 1)
        """Routing tables hold every decoder layer (the engine's layout); layers without routed experts
        (DeepSeek-V3's first dense layers) stay -1."""
        self.active = False
        self._step: dict[int, torch.Tensor] = {}
        self._requests: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        model.register_forward_hook(self._after_step, with_kwargs=True)

    def _bind(self, model) -> list[int]:
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        layers = []
        for module in model.modules():
            if isinstance(module, MoERunner) and hasattr(module.router, "set_capture_fn"):
                layer = module.layer_id
                module.router.set_capture_fn(lambda ids, layer=layer: self._capture(layer, ids))
                layers.append(layer)
        if not layers:
            raise ValueError("routing capture: no vLLM MoE router with set_capture_fn in this model")
        return sorted(layers)

    def start(self) -> None:
        self.active, self._requests, self._step = True, {}, {}

    def _capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        if self.active:
            self._step[layer] = topk_ids

    def _after_step(self, module, args, kwargs, output) -> None:
        if not self.active or not self._step:
            return
        step, self._step = self._step, {}
        num_reqs = self.runner.input_batch.num_reqs
        bounds = self.runner.query_start_loc.np[: num_reqs + 1].tolist()
        rows = bounds[-1]
        missing = [layer for layer in self.layers if layer not in step]
        if missing or any(step[layer].shape[0] < rows for layer in self.layers):
            raise RuntimeError(f"routing capture: layers {missing} did not route this step, or routed fewer "
                               f"than its {rows} tokens (vLLM data-parallel MoE layers are not supported)")
        # copies: vLLM reuses its input buffers from step to step
        k = step[self.layers[0]].shape[-1]
        routing = torch.full((rows, self.num_layers, k), -1, dtype=CAPTURE_DTYPE)
        for layer in self.layers:
            routing[:, layer] = step[layer][:rows].to("cpu", CAPTURE_DTYPE)
        tokens = kwargs["input_ids"][:rows].to("cpu", copy=True)
        positions = kwargs["positions"][:rows].to("cpu", copy=True)
        for i, req_id in enumerate(self.runner.input_batch.req_ids[:num_reqs]):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                self._requests.setdefault(req_id, []).append((positions[lo:hi], tokens[lo:hi], routing[lo:hi]))

    def finish(self) -> dict[tuple[int, ...], torch.Tensor]:
        """Stop; ``{token sequence: routing [len, L, k]}`` of every request whose positions
        ``0 .. len - 1`` were all run (a request missing a position is left out)."""
        self.active = False
        out = {}
        for chunks in self._requests.values():
            positions = torch.cat([c[0] for c in chunks])
            length = int(positions.max()) + 1
            tokens = torch.full((length,), -1, dtype=torch.long)
            routing = torch.full((length, self.num_layers, chunks[0][2].shape[-1]), -1, dtype=CAPTURE_DTYPE)
            tokens[positions] = torch.cat([c[1] for c in chunks]).long()
            routing[positions] = torch.cat([c[2] for c in chunks])
            if bool((tokens >= 0).all()):
                out[tuple(tokens.tolist())] = routing
        self._requests = {}
        return out


def routing_for(captured: dict[tuple[int, ...], torch.Tensor], prompt: list[int],
                response: list[int]) -> torch.Tensor:
    """``[len(prompt) + len(response), L, k]`` routing of one sampled sequence; a KeyError
    names the sequence when it was not recorded.

    A sequence ``s`` was run at positions ``0 .. len(s) - 2`` (its last token is sampled, not
    run); its last position then holds -1. With vLLM's async scheduling (on by default on
    GPUs) the scheduler plans a request's next step before it learns that the request has
    finished, so a finished request may also have run its last token: then the record is all
    of ``s`` and its last position's routing is real."""
    seq = list(prompt) + list(response)
    routing = captured.get(tuple(seq[:-1]))
    if routing is not None:
        return _last_not_run(routing)
    routing = captured.get(tuple(seq))
    if routing is not None:
        return routing
    lengths = sorted({len(key) for key in captured if key[:len(prompt)] == tuple(prompt)})
    raise KeyError(f"routing capture: no recorded request ran the {len(seq) - 1} tokens of a sampled "
                   f"sequence (prompt of {len(prompt)} tokens); {len(captured)} requests recorded, those "
                   f"with this prompt ran {lengths} tokens; was the prefix cache on?")


def routing_from_vllm(routed, prompt_len: int, response_len: int) -> torch.Tensor:
    """``[P + R, L, k]`` routing of a sequence from vLLM's own capture
    (``CompletionOutput.routed_experts``, ``rollout.routing_capture=vllm``), which holds the
    positions the engine ran: the prompt's, then each decode step's input token, so
    ``P + R - 1`` rows; the last position then holds -1, as with the hooks."""
    if routed is None:
        raise ValueError("vLLM returned no routed_experts for a sequence: its routing capture is off or "
                         "unsupported by this vLLM / model runner; set rollout.routing_capture=hooks")
    table = torch.as_tensor(routed).to(CAPTURE_DTYPE)
    total = prompt_len + response_len
    if table.dim() != 3 or table.shape[0] not in (total - 1, total):
        raise ValueError(f"vLLM returned routing of shape {tuple(table.shape)} for a sequence of {prompt_len} "
                         f"prompt + {response_len} response tokens (expected [{total - 1}, layers, k]); "
                         f"set rollout.routing_capture=hooks")
    return table if table.shape[0] == total else _last_not_run(table)


def _last_not_run(routing: torch.Tensor) -> torch.Tensor:
    """``[len - 1, L, k]`` -> ``[len, L, k]``: the last position (sampled, never run) holds -1."""
    return torch.cat([routing, routing.new_full((1, *routing.shape[1:]), -1)])
