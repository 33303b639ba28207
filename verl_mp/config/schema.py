"""The whole run's configuration: typed dataclasses, one source of truth for defaults.

Load with `verl_mp.config.loader.load_config` (a preset YAML from `megatron_configs/`
merged over these defaults, then CLI dotlist overrides). Presets only override; every
default lives here. The resolved object is saved with the run and handed unchanged to
every worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl_mp.config.engine import MAY_DIFFER_ON_RESUME, EngineSettings, ForwardSettings, ParamOffloadConfig
from verl_mp.config.moe import MoEConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.placement import PlacementConfig
from verl_mp.config.profile import ProfileConfig
from verl_mp.config.rollout import RolloutConfig
from verl_mp.utils.dtypes import INFERENCE_DTYPES, TRAIN_DTYPES, check_dtype

LAUNCHERS = ("torchrun", "ray")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
REWARD_MODEL_COMBINE = ("add", "replace")


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """HF checkpoint directory (config.json, safetensors, tokenizer). Empty means the
    embedded demo (docs/demo.md): its data and warm-started tiny Qwen2 model are built once
    and cached under ``$VERL_MP_CACHE`` (default ``.cache/verl_mp``, relative to the working
    directory) in ``demo-<key>/``; with the tiny_cpu preset the run then writes
    ``outputs/demo/demo-<key>/``."""
    dtype: str = "fp32"
    """Training dtype: fp32 or bf16 (optimizer state is always fp32; the rollout uses the
    same dtype). fp16 is refused: it overflows in RL without loss scaling."""

    def __post_init__(self) -> None:
        check_dtype("model.dtype", self.dtype, TRAIN_DTYPES)


@dataclass(kw_only=True)
class FilterGroupsConfig:
    """Dynamic sampling (DAPO): groups whose samples all got the same reward carry no
    learning signal under group-relative advantages (their advantages are 0), so they are
    dropped and the step is refilled with groups of new prompts."""

    enable: bool = False
    """Turn dynamic sampling on (GRPO-style groups: rollout.sampling.n > 1)."""
    max_extra_rounds: int = 2
    """Generation rounds of data.train_batch_size new prompts each, at most, that a step may
    add to refill the dropped groups. When the rounds are used up the batch is topped up
    with dropped groups (their advantages are 0) and filter/topped_up_groups counts them."""

    def __post_init__(self) -> None:
        if self.max_extra_rounds < 0:
            raise ValueError(f"data.filter_groups.max_extra_rounds={self.max_extra_rounds} must be >= 0")


@dataclass(kw_only=True)
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Parquet prompt files (verl schema). Empty with an empty model.path: the embedded
    synthetic arithmetic task."""
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    max_prompt_length: int = 128
    """Prompts longer than this (in tokens, after the chat template) are dropped and counted."""
    train_batch_size: int = 8
    """Prompts per RL step (each sampled ``rollout.sampling.n`` times)."""
    val_batch_size: int = 64
    shuffle: bool = True
    seed: int = 0
    skip_bad_rows: bool = False
    """Skip (and count) bad rows instead of stopping at the first one: rows that break the
    schema, text that is not UTF-8, prompts the chat template raises on, the rows of a row
    group whose pages are corrupt. Without it the run stops naming the file, row and cause."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """Drop groups of equal rewards and refill the batch (needs rollout.sampling.n > 1)."""


ROUTER_REPLAY_MODES = ("off", "rollout", "old_logprob")
OLD_LOG_PROB_SOURCES = ("auto", "forward")


@dataclass(kw_only=True)
class EngineRoleConfig(EngineSettings):
    """A Megatron engine role that trains (actor or critic).

    Roles colocated in the same processes share the actor's parallel layout
    (``actor.megatron``): megatron keeps one model-parallel state per process. A critic on
    its own pool (``trainer.placement``) may have its own (``critic.megatron``).
    Every field reaches the role's engine on every rank (`verl_mp.plan`).
    """


@dataclass(kw_only=True)
class ReferenceConfig(ForwardSettings):
    """The reference policy: a frozen copy of the initial actor, one forward pass per step on the
    actor's layout. It has no optimizer, gradients or backward pass, so of the engine settings
    it takes only how its passes batch and attend, and whether its parameters leave the device
    while the rollout generates; its engine gets the defaults of the rest (`verl_mp.plan`)."""

    offload: ParamOffloadConfig = field(default_factory=lambda: ParamOffloadConfig(params=True),
                                        metadata=MAY_DIFFER_ON_RESUME)
    _section: ClassVar[str] = "ref"


@dataclass(kw_only=True)
class PolicyUpdateConfig:
    """How the actor is updated (the loss, `verl_mp.workers.losses.actor_loss`, and the epochs): what
    the plan sends the workers of the ``actor`` section."""

    ppo_epochs: int = 1
    """Passes over each RL step's batch."""
    policy_loss: str = "ppo"
    """A name in verl_mp.algo.POLICY_LOSSES or a ``module:function`` plugin."""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    """Set above clip_ratio_low for DAPO's clip-higher."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound for negative advantages; null disables it."""
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    """Add a KL(actor || reference) term to the loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "k3"


@dataclass(kw_only=True)
class ValueUpdateConfig:
    """How the critic is updated (the loss, `verl_mp.workers.losses.critic_loss`, and the epochs): what
    the plan sends the workers of the ``critic`` section."""

    ppo_epochs: int = 1
    """Passes over each RL step's batch."""
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"


@dataclass(kw_only=True)
class ActorConfig(PolicyUpdateConfig, EngineRoleConfig):
    _section: ClassVar[str] = "actor"
    megatron: ParallelConfig = field(default_factory=ParallelConfig)
    """The parallel layout of the actor and reference (and of a colocated critic)."""
    moe: MoEConfig = field(default_factory=MoEConfig)
    """Router losses, token dispatch and expert capacity of a mixture-of-experts actor (ignored
    by dense models). The reference policy and a critic (PPO, on the same MoE body) route
    with the same settings."""
    router_replay: str = "off"
    """Mixture-of-experts routing replay: ``off`` (every pass routes on its own), ``rollout``
    (vLLM records each token's experts while sampling and the actor's old-log-prob pass and
    update route every token exactly so: trainer and rollout see the same experts; how the
    rollout records them: ``rollout.routing_capture``), ``old_logprob`` (the old-log-prob
    pass records its routing and the update replays it: the PPO ratio compares the same
    experts). The reference policy always routes on its own."""
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (x rollout.sampling.n samples); must divide data.train_batch_size."""
    old_log_probs: str = "auto"
    """Where the PPO ratio's old log-probs come from: ``forward`` (a forward pass of the actor
    before the update, every step) or ``auto``: from the update's own forward pass wherever
    that is the same thing, i.e. one optimizer step a step (``ppo_epochs=1``,
    ``ppo_mini_batch_size`` = ``data.train_batch_size``) on samples of the current weights
    (``trainer.off_policy_steps=0``, no multi-turn carry-over), and nothing reads them before
    the update (no rollout correction, no KL in the reward, no estimator input, no
    ``router_replay=old_logprob``, no ``rollout.logprob_diff_threshold``, whose check comes
    before the update); otherwise the forward pass (`verl_mp.plan.old_log_probs_in_update`).
    The ratio is then exactly 1 (as in TRL with one iteration: ``actor/approx_kl`` and
    ``actor/clipfrac`` read 0) and the rollout-vs-trainer gap is measured in the update's
    forward pass."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.old_log_probs not in OLD_LOG_PROB_SOURCES:
            raise ValueError(f"actor.old_log_probs={self.old_log_probs!r} is not one of {OLD_LOG_PROB_SOURCES}")
        if self.router_replay == "False":  # YAML reads a bare `off` as false (`actor.router_replay=off`)
            self.router_replay = "off"
        if self.router_replay not in ROUTER_REPLAY_MODES:
            raise ValueError(f"actor.router_replay={self.router_replay!r} is not one of {ROUTER_REPLAY_MODES}")


@dataclass(kw_only=True)
class CriticConfig(ValueUpdateConfig, EngineRoleConfig):
    _section: ClassVar[str] = "critic"
    enable: bool | None = None
    """None: on exactly when the advantage estimator needs values (gae)."""
    megatron: ParallelConfig | None = None
    """The critic's own layout when it runs on its own pool (trainer.placement.roles.critic);
    None: the actor's. A colocated critic must use the actor's layout."""


@dataclass(kw_only=True)
class KLControlConfig:
    type: str = "fixed"
    """fixed or adaptive."""
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


CORRECTION_OFF = "none"


@dataclass(kw_only=True)
class RolloutCorrectionConfig:
    """Corrections for the mismatch between the rollout's policy (other kernels, and with
    trainer.off_policy_steps > 0 older weights) and the actor's before the update
    (`verl_mp.algo.rollout_correction`). Per token the ratio r = pi_old / pi_rollout
    becomes a weight that multiplies the policy-gradient term. Turning one on makes the
    rollout return its log-probs on every step."""

    is_level: str = CORRECTION_OFF
    """Importance weights: ``none``, ``token`` (truncated IS, min(r_t, is_threshold)),
    ``sequence`` (min(prod_t r_t, is_threshold) on every token of a sample), or a
    ``module:function`` plugin (verl_mp.algo.ROLLOUT_IS's signature)."""
    is_threshold: float = 2.0
    """Upper truncation of the importance weights (> 0)."""
    mask_level: str = CORRECTION_OFF
    """Rejection: ``none``, ``token`` (weight 0 on tokens whose r_t leaves [mask_low,
    mask_high]), ``sequence`` (weight 0 on samples whose geometric-mean ratio leaves it), or
    a ``module:function`` plugin (verl_mp.algo.ROLLOUT_MASKS's signature). Masked tokens
    still count in the loss's normalisers, like any weight."""
    mask_low: float = 0.5
    """Lower end of the band of ratios kept by mask_level (>= 0)."""
    mask_high: float = 2.0
    """Upper end of the band of ratios kept by mask_level (> mask_low)."""

    @property
    def enabled(self) -> bool:
        return self.is_level != CORRECTION_OFF or self.mask_level != CORRECTION_OFF

    def __post_init__(self) -> None:
        if self.is_threshold <= 0:
            raise ValueError(f"algorithm.rollout_correction.is_threshold={self.is_threshold} must be > 0")
        if not 0 <= self.mask_low < self.mask_high:
            raise ValueError(f"algorithm.rollout_correction.mask_low={self.mask_low} and mask_high="
                             f"{self.mask_high} must satisfy 0 <= mask_low < mask_high")


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """A name in verl_mp.algo.ADVANTAGE_ESTIMATORS or a ``module:function`` plugin."""
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    """False gives Dr.GRPO."""
    estimator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the advantage estimator (a plugin's own settings)."""
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass(kw_only=True)
class RewardConfig:
    default_fn: str | None = None
    """Reward function for data sources without a mapping: a registered name
    (gsm8k, math_boxed, arith_exact, format) or ``module:function``."""
    fn_by_source: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    """A reward call slower than this scores 0 and counts in reward/num_timeout."""
    num_workers: int = 2
    memory_limit_mb: int | None = 4096
    """Address space of each reward worker (RLIMIT_AS); past it allocations fail and the
    call counts as failed. None: no limit."""
    cpu_limit_s: int | None = 3600
    """CPU seconds a reward worker may use in its life (RLIMIT_CPU); past it the worker is
    ended and its call counts as failed. None: no limit."""
    max_open_files: int | None = 1024
    """Open files of each reward worker (RLIMIT_NOFILE). None: inherited."""
    max_processes: int | None = None
    """RLIMIT_NPROC of reward workers. Linux counts all processes and threads of the user
    and exempts root, so it is off by default; set it where workers run as their own user."""
    max_calls_per_worker: int = 1000
    """Calls after which a reward worker is replaced by a fresh one (leaks do not pile up)."""
    pass_env: list[str] = field(default_factory=list)
    """Environment variables passed to reward workers (names or ``fnmatch`` patterns, e.g.
    ``[JUDGE_API_KEY, JUDGE_*]``). Workers get only an allowlist otherwise: PATH, HOME, the
    locale, TMPDIR, ``PYTHON*``, ``VERL_MP_*``, library, certificate and cache paths, thread
    counts (`verl_mp.reward.worker_proc.WORKER_ENV_NAMES`); never tokens, keys, database URLs,
    webhooks or proxies unless named here."""

    max_failure_fraction: float = 0.5
    """The run stops when more than this fraction of one reward function's calls in a step
    fail (raise, return a non-number or NaN, time out), naming the function and its first
    errors: a function that fails for most samples (a bug, a judge service that is down) would
    otherwise train on zeros. Failed calls below it score 0 (counted in reward/num_failed,
    reward/num_timeout). 1.0: never stop."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(f"reward.max_failure_fraction={self.max_failure_fraction} must be in [0, 1] "
                             "(1: never stop for failed reward calls)")
        for name in ("memory_limit_mb", "cpu_limit_s", "max_open_files", "max_processes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"reward.{name}={value} must be >= 1, or null for no limit")
        if self.max_calls_per_worker < 1:
            raise ValueError(f"reward.max_calls_per_worker={self.max_calls_per_worker} must be >= 1")


@dataclass(kw_only=True)
class RewardModelConfig:
    """A learned reward model: an HF sequence classifier with one output (num_labels=1).

    It scores the chat-templated prompt text followed by the decoded response, so it
    must read the policy's chat format. It runs on the pool of
    ``trainer.placement.roles.reward_model``: the actor's (default: every rank of the
    actor group, torchrun ranks included, holds a copy and scores its share of the batch)
    or its own pool (Ray mode: one Ray worker per rank there, each scoring a share).
    Colocated on GPUs it stays in device memory next to the actor and the rollout engine.
    """

    enable: bool = False
    path: str = ""
    """HF checkpoint directory of the reward model (config.json, weights, tokenizer)."""
    combine: str = "add"
    """How the score reaches the batch: ``add`` (rule reward + coef x model score; the
    rule functions of ``reward`` still run) or ``replace`` (coef x model score only; no
    rule function runs, so no reward/accuracy)."""
    coef: float = 1.0
    """Weight of the model score."""
    dtype: str = "fp32"
    """fp32, bf16 or fp16 (bf16 on GPUs)."""
    max_length: int = 4096
    """Tokens per scored text; longer texts lose their beginning (the response end is kept)."""
    micro_batch_size: int = 8
    """Texts per forward pass on each rank."""

    def __post_init__(self) -> None:
        if self.combine not in REWARD_MODEL_COMBINE:
            raise ValueError(f"reward_model.combine={self.combine!r} is not one of {REWARD_MODEL_COMBINE}")
        check_dtype("reward_model.dtype", self.dtype, INFERENCE_DTYPES)
        if self.micro_batch_size < 1 or self.max_length < 1:
            raise ValueError("reward_model.micro_batch_size and reward_model.max_length must be >= 1")


@dataclass(kw_only=True)
class TrainerConfig:
    launcher: str = "torchrun"
    """torchrun (SPMD, no Ray) or ray (single controller)."""
    nproc: int = 2
    """Ranks per node (GPUs, or gloo processes on CPU)."""
    nnodes: int = 1
    """Nodes. Multi-node runs start the ranks themselves (launch/slurm.sbatch: torchrun on
    every node running verl_mp.cli.rank_train; or a Ray cluster for trainer.launcher=ray)."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes
    total_steps: int = 20
    max_steps_this_run: int | None = None
    """Stop this invocation after this many steps (e.g. a job's time limit); a later run
    with resume_mode=auto continues. The LR schedule still spans total_steps."""
    save_freq: int = 10
    """Checkpoint every N steps (0: only at the end when save_final is set, and on an
    interrupt when save_on_interrupt is set)."""
    save_final: bool = True
    save_on_interrupt: bool = True
    """On the first Ctrl-C (SIGINT) or SIGTERM: finish the step, save a checkpoint, stop every
    rank and exit; a second Ctrl-C stops at once (the last checkpoint stays)."""
    test_freq: int = 5
    """Validate every N steps (0 disables); also before the first step when val_before_train."""
    val_before_train: bool = True
    default_local_dir: str = "outputs/run"
    resume_mode: str = "auto"
    """auto (latest complete checkpoint; an error if a different run wrote it, e.g. another
    model or algorithm: see verl_mp/trainer/resume_check.py), disable, or a path to a
    global_step_N directory (resumed even if its run differs, with a warning)."""
    max_ckpt_to_keep: int | None = 2
    seed: int = 1
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    project_name: str = "verl_mp"
    experiment_name: str = "run"
    gpu_memory_gib: float | None = None
    """Memory of one GPU for the preflight check that the run fits (`verl-mp plan`): the run
    is refused before start-up, with the numbers and fixes, when a phase would not fit.
    None: the local GPU's when the driver has one, else no check (a CPU-only driver)."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device in the model dtype (e.g. 989 for H100/H200 bf16);
    set it to get perf/mfu. perf/tflops_per_s is always logged."""
    export_hf_at_end: bool = True
    """Write the final actor as an HF checkpoint under default_local_dir/hf."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Resource pools and the pool of each role (Ray mode); default: everything colocated
    on trainer.nnodes x trainer.nproc ranks. See verl_mp/config/placement.py."""
    off_policy_steps: int = 0
    """K: how many steps generation may run ahead of training. 0: on-policy (each step
    generates, then trains). 1: step k+1 is generated while step k trains, with weights one
    update older; K bounds how stale a sample can be (updates between the weights it was
    generated with and the actor it trains). Needs the rollout on a pool of its own
    (trainer.placement.roles.rollout); pair it with algorithm.rollout_correction."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """torch.profiler over chosen steps (verl_mp/config/profile.py); off by default."""

    def __post_init__(self) -> None:
        if self.off_policy_steps < 0:
            raise ValueError(f"trainer.off_policy_steps={self.off_policy_steps} must be >= 0 (0: on-policy)")


@dataclass(kw_only=True)
class RootConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: ReferenceConfig = field(default_factory=ReferenceConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
