"""Settings the planner chooses when the run leaves them unset (issue 39: fast by default).

`choose(cfg, spec, options)` returns the run configuration with every engine role that sets
neither ``micro_batch_size`` nor ``max_tokens_per_micro_batch`` given a token budget
(``max_tokens_per_micro_batch``: rows sorted by length, packed up to the budget), and a
`Choice` per decision with its reason. The budget is the largest that keeps every phase of
the plan under `HEADROOM` of the GPU, up to `BUDGET_CAP` and to the tokens one
data-parallel rank holds in a mini-batch (a larger budget changes nothing).
Without a GPU to plan for (a CPU run, no ``trainer.gpu_memory_gib``), the budget is
`default_token_budget`: 4 full-length sequences, the worst case of the former default of 4 rows.

On a GPU the rollout's CUDA-graph range is chosen too when unset
(``rollout.cudagraph_max_tokens``, `cudagraph_tokens`): vLLM replays graphs for steps of up
to 512 tokens by default but decodes up to 1024 sequences at once on H100/H200, and a
multi-turn step prefills the next turns beside the decoding ones; a step past the range runs
without a graph. So is how often a multi-turn rollout's new turns join the engine
(``rollout.multi_turn.admit_every_steps``, `MULTI_TURN_ADMIT_EVERY`): grouped, so that most
steps decode only.

Preflight applies the choices (`plan.yaml` shows them; ``config.yaml`` keeps what the user
wrote); ``verl-mp plan`` prints them with their reasons.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from verl_mp.config.parallel import validate_layout
from verl_mp.config.engine import DEFAULT_BUDGET_ROWS, default_token_budget
from verl_mp.config.engine import ForwardSettings
from verl_mp.config.schema import RootConfig
from verl_mp.models.spec import GPTSpec
from verl_mp.config.placement import resolve_placement
from verl_mp.plan import critic_enabled, enabled_roles, reference_enabled
from verl_mp.planner.memory_plan import MemoryPlanOptions, plan_memory

HEADROOM = 0.9
"""Chosen settings keep every phase under this share of the GPU: room for the allocator's
fragmentation and the estimates' error (calibrated within 1% on the H200's train step)."""
BUDGET_CAP = {"actor": 16384, "critic": 16384, "ref": 32768}
"""Largest chosen budget per role (tokens per micro-batch); a forward-only pass (the
reference) keeps no activations for backward, so it takes twice the training roles'.
Measured on one H200 (benchmarks/RESULTS.md, "verl_mp, verl and TRL side by side"): in the
GRPO loop of the 1.5B body a 32768-token actor budget updated slower than 18432 (3.2 s vs
2.9 s a step) and filled the card to 139.3 of 140.4 GiB (cached blocks of micro-batches of
varying shapes); the engine alone gained ~5% from 16k to 32k tokens."""
BUDGET_STEP = 1024
VLLM_GRAPH_TOKENS = 512
"""vLLM 0.26's largest captured step by default (``min(2 x max_num_seqs, 512)``)."""
OWN_GRAPH_RANGE = {"vllm": lambda tp: VLLM_GRAPH_TOKENS, "sglang": lambda tp: 256 if tp < 4 else 512}
"""Each GPU backend's own largest CUDA-graph batch on H100/H200, by rollout TP size: vLLM's
steps of 512 tokens, SGLang 0.5.17's decode batches of 256 sequences below TP 4, else 512
(``server_args.py``, by GPU memory)."""
VLLM_DECODE_SEQS = {True: 1024, False: 256}
"""vLLM 0.26's default ``max_num_seqs`` for the offline engine, on GPUs of 70 GiB or more (True;
A100s excepted) and on smaller ones: the most sequences one engine decodes at once. The
planner's graph ranges stop there for SGLang too (its limit is its KV cache)."""
MULTI_TURN_ADMIT_EVERY = 16
"""``rollout.multi_turn.admit_every_steps`` for a vLLM rollout with CUDA graphs. Measured on
H100s with vLLM 0.26 and the 0.5B body, 512 conversations (benchmarks/RESULTS.md, "Second GPU
pass", "Third GPU pass"): a step that prefills new turns beside the decoding ones cost ~3x a
decode-only step (19 against 6.6 ms, from 701 steps with 381 admissions at 1 against 839 with
37 at 16); 16 made the multi-turn engine benchmark 1.22-1.59x faster on three machines, and
the GRPO loop 1.03-1.05x on the one machine that ran both. Each turn waits < 16 steps (~0.1 s)."""
MULTI_TURN_GRAPH_ROOM = 256
"""Tokens above the decoding sequences a multi-turn step's graph leaves for the next turns'
prefill: each admitted turn prefills its tool response (``max_tool_response_tokens`` or
less, plus the chat template's fragments) and the unfinished KV block before it."""


@dataclass(frozen=True)
class Choice:
    key: str
    value: object
    reason: str

    def line(self) -> str:
        return f"{self.key}={self.value}: {self.reason}"


def auto_roles(cfg: RootConfig) -> list[str]:
    """The enabled engine roles whose micro-batching the run leaves to the planner."""
    roles = ["actor"] + (["critic"] if critic_enabled(cfg) else []) + (["ref"] if reference_enabled(cfg) else [])
    return [r for r in roles if _unset(getattr(cfg, r))]


def _unset(section: ForwardSettings) -> bool:
    return section.micro_batch_size is None and section.max_tokens_per_micro_batch is None


def _with_budgets(cfg: RootConfig, budgets: dict[str, int]) -> RootConfig:
    return dataclasses.replace(cfg, **{role: dataclasses.replace(getattr(cfg, role), max_tokens_per_micro_batch=b)
                                       for role, b in budgets.items()})


def choose(cfg: RootConfig, spec: GPTSpec, options: MemoryPlanOptions | None) -> tuple[RootConfig, list[Choice]]:
    """``cfg`` with the unset micro-batching (and, on a GPU, the rollout's CUDA-graph range
    and a multi-turn rollout's admission interval) filled in, and what was chosen.
    ``options`` None: no GPU to plan for."""
    cfg, choices = _choose_budgets(cfg, spec, options)
    r = cfg.rollout
    eager = r.runs_eager(record_routing=cfg.actor.router_replay == "rollout")
    if options is not None and r.backend in OWN_GRAPH_RANGE and r.cudagraph_max_tokens is None and not eager:
        tokens, why = cudagraph_tokens(cfg, options.gpu_memory_gib)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(r, cudagraph_max_tokens=tokens))
        choices.append(Choice("rollout.cudagraph_max_tokens", tokens, why))
    r = cfg.rollout
    if options is not None and r.backend == "vllm" and r.multi_turn.enable and r.multi_turn.admit_every_steps is None \
            and not eager:
        multi_turn = dataclasses.replace(r.multi_turn, admit_every_steps=MULTI_TURN_ADMIT_EVERY)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(r, multi_turn=multi_turn))
        choices.append(Choice("rollout.multi_turn.admit_every_steps", MULTI_TURN_ADMIT_EVERY,
                              "new turns join the engine together: a step that prefills them beside the decoding "
                              "ones runs without the full CUDA graph (~3x a decode-only step on an H100)"))
    return cfg, choices


def cudagraph_tokens(cfg: RootConfig, gpu_memory_gib: float) -> tuple[int, str]:
    """The CUDA-graph range for the run's rollout engines (``rollout.cudagraph_max_tokens``)
    and why: every sequence one engine decodes at once (each engine takes every
    ``engines``-th prompt with its ``n`` samples, at most `VLLM_DECODE_SEQS`), plus
    `MULTI_TURN_GRAPH_ROOM` for a multi-turn rollout, rounded up to vLLM's stride of 16; 0
    (the backend's own) where `OWN_GRAPH_RANGE` covers that."""
    placement = resolve_placement(cfg.trainer, enabled_roles(cfg))
    engines = max(1, placement.pool_size("rollout") // cfg.rollout.tensor_model_parallel_size)
    seqs = -(-cfg.data.train_batch_size // engines) * cfg.rollout.sampling.n
    multi_turn = cfg.rollout.multi_turn.enable
    most = VLLM_DECODE_SEQS[gpu_memory_gib >= 70]
    own = OWN_GRAPH_RANGE[cfg.rollout.backend](cfg.rollout.tensor_model_parallel_size)
    name = {"vllm": "vLLM", "sglang": "SGLang"}[cfg.rollout.backend]
    tokens = graph_tokens(seqs, multi_turn, own, most)
    held = f"{min(seqs, most)} sequences per engine ({seqs} samples on the busiest of {engines} " \
           f"engine{'s' if engines > 1 else ''}, " + \
           (f"at most {most} decoded at once)" if cfg.rollout.backend == "vllm" else f"capped at {most})") + \
           (f" + {MULTI_TURN_GRAPH_ROOM} tokens for the next turns' prefill" if multi_turn else "")
    if not tokens:
        return 0, f"{name}'s own CUDA-graph sizes cover every step: {held}"
    return tokens, f"CUDA graphs up to {tokens}-token steps, {name}'s own stop at {own}: {held}"


def graph_tokens(seqs_per_engine: int, multi_turn: bool, own: int = VLLM_GRAPH_TOKENS,
                 most: int = VLLM_DECODE_SEQS[True]) -> int:
    """`cudagraph_tokens`' arithmetic: 0 where the backend's ``own`` range suffices."""
    room = MULTI_TURN_GRAPH_ROOM if multi_turn else 0
    tokens = -(-(min(seqs_per_engine, most) + room) // 16) * 16
    return tokens if tokens > own else 0


def _choose_budgets(cfg: RootConfig, spec: GPTSpec,
                    options: MemoryPlanOptions | None) -> tuple[RootConfig, list[Choice]]:
    roles = auto_roles(cfg)
    if not roles:
        return cfg, []
    seq = cfg.data.max_prompt_length + cfg.rollout.sampling.max_new_tokens
    if options is None:
        budget = default_token_budget(seq)
        budgets = {r: budget for r in roles}
        why = f"no GPU to plan for: {DEFAULT_BUDGET_ROWS} sequences of {seq} tokens (set trainer.gpu_memory_gib to plan one)"
        return _with_budgets(cfg, budgets), [Choice(f"{r}.max_tokens_per_micro_batch", budget, why) for r in roles]
    dp = validate_layout(cfg.actor.megatron, cfg.trainer.world_size, spec.shape, prefix="actor.megatron.")
    rank_tokens = -(-cfg.actor.ppo_mini_batch_size * cfg.rollout.sampling.n // dp) * seq
    budgets = {r: seq for r in roles}  # the least any budget can be: one full-length sequence
    if not _fits(_with_budgets(cfg, budgets), spec, options):
        return _with_budgets(cfg, budgets), [
            Choice(f"{r}.max_tokens_per_micro_batch", seq, "even one full-length sequence per micro-batch leaves "
                   f"under {1 - HEADROOM:.0%} of the GPU free (verl-mp plan shows why)") for r in roles]
    choices = []
    for role in roles:  # grow each role's budget in turn, the others held at what they got
        cap = max(seq, min(BUDGET_CAP[role], rank_tokens))
        steps = sorted({seq, cap} | set(range(-(-seq // BUDGET_STEP) * BUDGET_STEP, cap, BUDGET_STEP)))
        lo, hi = 0, len(steps) - 1  # steps[lo] fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _fits(_with_budgets(cfg, budgets | {role: steps[mid]}), spec, options):
                lo = mid
            else:
                hi = mid - 1
        budgets[role] = steps[lo]
        if steps[lo] < cap:
            limit = f"the largest that keeps every phase under {HEADROOM:.0%} of {options.gpu_memory_gib:.1f} GiB"
        elif cap == rank_tokens:
            limit = "all of one data-parallel rank's mini-batch in one micro-batch"
        else:
            limit = f"the cap for {role} ({BUDGET_CAP[role]} tokens: larger measured no faster, RESULTS.md)"
        choices.append(Choice(f"{role}.max_tokens_per_micro_batch", steps[lo],
                              f"token-budget micro-batches (rows sorted by length, packed); {limit}"))
    return _with_budgets(cfg, budgets), choices


def _fits(cfg: RootConfig, spec: GPTSpec, options: MemoryPlanOptions) -> bool:
    result = plan_memory(cfg, spec, options)
    return not result.problems and all(ph.total <= HEADROOM * result.gpu_bytes for ph in result.phases)


def render_choices(cfg: RootConfig, spec: GPTSpec, choices: list[Choice]) -> str:
    """The settings a run gets that it did not set: the planner's choices, and the rollout's
    resolved defaults, each with its reason."""
    lines = ["settings chosen for this run (set a key to override it):"]
    lines += [f"  {c.line()}" for c in choices]
    for role in ("actor", "critic", "ref"):
        section = getattr(cfg, role)
        if role not in [c.key.split(".")[0] for c in choices] and (role == "actor" or (
                critic_enabled(cfg) if role == "critic" else reference_enabled(cfg))):
            how = (f"max_tokens_per_micro_batch={section.max_tokens_per_micro_batch}"
                   if section.max_tokens_per_micro_batch is not None else f"micro_batch_size={section.micro_batch_size}")
            lines.append(f"  {role}.{how}: set by the run")
    sleep = cfg.rollout.sleep_level
    if sleep is None:
        sleep = 1 if spec.moe is not None else 2
        lines.append(f"  rollout.sleep_level={sleep}: {'a mixture of experts keeps its weights asleep in CPU memory (level 1)' if sleep == 1 else 'a dense model drops its weights while training (level 2): the sync rewrites them'}")
    else:
        lines.append(f"  rollout.sleep_level={sleep}: set by the run")
    if cfg.rollout.cudagraph_max_tokens is not None and "rollout.cudagraph_max_tokens" not in [c.key for c in choices]:
        lines.append(f"  rollout.cudagraph_max_tokens={cfg.rollout.cudagraph_max_tokens}: set by the run")
    admit = cfg.rollout.multi_turn.admit_every_steps
    if cfg.rollout.multi_turn.enable and "rollout.multi_turn.admit_every_steps" not in [c.key for c in choices]:
        lines.append(f"  rollout.multi_turn.admit_every_steps={admit or 1}: "
                     + ("set by the run" if admit is not None else "each new turn joins at the next step (no CUDA "
                        "graphs to keep whole: a CPU run, or vLLM eager)"))
    lines.append(f"  rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization}: vLLM's share of the GPU "
                 "while it generates (the KV cache is the rest of it after the weights; the table shows its tokens)")
    return "\n".join(lines)
