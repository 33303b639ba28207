"""The whole run's configuration: typed dataclasses, one source of truth for defaults.

Load with `verl_mp.config.loader.load_config` (a preset YAML from `megatron_configs/`
merged over these defaults, then CLI dotlist overrides). Presets only override; every
default lives here. The resolved object is saved with the run and handed unchanged to
every worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.rollout import RolloutConfig

LAUNCHERS = ("torchrun", "ray")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """HF checkpoint directory (config.json, safetensors, tokenizer). Empty means the
    embedded demo (docs/demo.md): its data and warm-started tiny Qwen2 model are built once
    and cached under ``$VERL_MP_CACHE`` (default ``.cache/verl_mp``, relative to the working
    directory) in ``demo-<key>/``; with the tiny_cpu preset the run then writes
    ``outputs/demo/demo-<key>/``."""
    dtype: str = "fp32"
    """Training dtype: fp32, bf16 or fp16 (optimizer state is always fp32)."""


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
    """Skip (and count) malformed rows instead of stopping at the first one."""


@dataclass(kw_only=True)
class EngineRoleConfig:
    """A Megatron engine role (actor, reference or critic).

    All roles are colocated in the same processes and share the actor's parallel
    layout (``actor.megatron``): megatron keeps one model-parallel state per process.
    """

    optim: OptimConfig = field(default_factory=OptimConfig)
    micro_batch_size: int = 4
    """Sequences per micro-batch on each data-parallel rank."""
    max_tokens_per_micro_batch: int | None = None
    """Dynamic batch size: pack micro-batches up to this many tokens (None: by count)."""
    offload: bool = False
    """Move parameters/grads/optimizer state to CPU while the rollout runs (GPU only)."""


@dataclass(kw_only=True)
class ActorConfig(EngineRoleConfig):
    megatron: ParallelConfig = field(default_factory=ParallelConfig)
    """The parallel layout of every engine (actor, reference, critic) in this run."""
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (x rollout.sampling.n samples); must divide data.train_batch_size."""
    ppo_epochs: int = 1
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
class CriticConfig(EngineRoleConfig):
    enable: bool | None = None
    """None: on exactly when the advantage estimator needs values (gae)."""
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1


@dataclass(kw_only=True)
class KLControlConfig:
    type: str = "fixed"
    """fixed or adaptive."""
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """A name in verl_mp.algo.ADVANTAGE_ESTIMATORS or a ``module:function`` plugin."""
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    """False gives Dr.GRPO."""
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass(kw_only=True)
class RewardConfig:
    default_fn: str | None = None
    """Reward function for data sources without a mapping: a registered name
    (gsm8k, math_boxed, arith_exact, format) or ``module:function``."""
    fn_by_source: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    """A reward call slower than this scores 0 and counts in reward/num_timeout."""
    num_workers: int = 2


@dataclass(kw_only=True)
class TrainerConfig:
    launcher: str = "torchrun"
    """torchrun (SPMD, no Ray) or ray (single controller)."""
    nproc: int = 2
    """Ranks per node (GPUs, or gloo processes on CPU)."""
    nnodes: int = 1
    """Nodes. Multi-node runs start the ranks themselves (launch/slurm.sbatch: torchrun on
    every node running verl_mp.trainer.spmd; or a Ray cluster for trainer.launcher=ray)."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes
    total_steps: int = 20
    max_steps_this_run: int | None = None
    """Stop this invocation after this many steps (e.g. a job's time limit); a later run
    with resume_mode=auto continues. The LR schedule still spans total_steps."""
    save_freq: int = 0
    """Checkpoint every N steps (0: only at the end when save_final is set)."""
    save_final: bool = True
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
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device in the model dtype (e.g. 989 for H100/H200 bf16);
    set it to get perf/mfu. perf/tflops_per_s is always logged."""
    export_hf_at_end: bool = True
    """Write the final actor as an HF checkpoint under default_local_dir/hf."""


@dataclass(kw_only=True)
class RootConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: EngineRoleConfig = field(default_factory=lambda: EngineRoleConfig(offload=True))
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
