"""``verl-mp plan``: per-GPU memory of every phase of a run, before anything starts.

    verl-mp plan --config-name grpo model.path=/ckpt/Qwen2.5-7B [overrides] [--gpu-memory-gib 80]

Reads the preset and overrides exactly as ``verl-mp train`` does and the model's shape
from ``model.path``/config.json (no weights, no GPU). With no ``model.path``, a demo preset
(``tiny_cpu``, ``tiny_moe_cpu``, ``demo_gpu``) plans its demo model, whose config.json is written to a
temporary directory (nothing is trained). Prints the table and, when the run
does not fit, ranked overrides that make it fit. Exit status: 0 fits, 1 does not fit,
2 bad input.
"""

from __future__ import annotations

import json
import os

from verl_mp.config.loader import load_config
from verl_mp.planner.advice import suggest
from verl_mp.planner.choose import choose, render_choices
from verl_mp.planner.plan import PlanOptions, plan
from verl_mp.planner.report import render, render_suggestions


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("plan", help="per-GPU memory of every phase of a run (no GPU needed)")
    p.add_argument("--config-name", default="grpo", help="preset in megatron_configs/ or a YAML path")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0,
                   help="memory of one GPU in GiB (H100 80GB: 79.6, H200: 140.4; default 80)")
    p.add_argument("--logprob-impl", choices=("fused", "torch"), default="fused",
                   help="the engine's kernels: the fused Triton ones (default on CUDA: the LM head's "
                        "log-prob op, RMSNorm, SwiGLU) or the torch path (VERL_MP_KERNELS=torch)")
    p.add_argument("--keep-cache", action="store_true",
                   help="model a trainer that never releases PyTorch's cached blocks between phases "
                        "(the cause of issue 21's out-of-memory at vLLM wake-up)")
    p.add_argument("--suggest", action="store_true", help="also list what to change when the run fits")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, as for verl-mp train")
    p.set_defaults(func=run_plan)


def read_spec(model_path: str):
    """`GPTSpec` of ``model_path``/config.json (only the config is read)."""
    from verl_mp.models.hf_config import spec_from_hf_config

    path = os.path.join(model_path, "config.json")
    if not model_path or not os.path.isfile(path):
        raise ValueError(f"model.path={model_path!r} has no config.json; the planner reads the model's shape "
                         "from it (only config.json is needed, no weights)")
    with open(path) as f:
        return spec_from_hf_config(json.load(f), source=path)


def _demo_spec(config_name: str):
    """`GPTSpec` of a demo preset's model (`verl_mp.demo.warm_start.DEMO_PRESETS`), or None."""
    import tempfile

    from verl_mp.demo.presets import DEMO_PRESETS
    from verl_mp.demo.warm_start import write_demo_model_config

    settings = DEMO_PRESETS.get(config_name)
    if settings is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return read_spec(str(write_demo_model_config(tmp, settings)))


def run_plan(args) -> int:
    cfg = load_config(args.config_name, args.overrides)
    spec = _demo_spec(args.config_name) if not cfg.model.path else None
    spec = spec or read_spec(cfg.model.path)
    options = PlanOptions(gpu_memory_gib=args.gpu_memory_gib, logprob_impl=args.logprob_impl,
                          cache_released=not args.keep_cache)
    cfg, choices = choose(cfg, spec, options)
    result = plan(cfg, spec, options)
    print(render(result, title=f"verl-mp plan --config-name {args.config_name} ({cfg.model.dtype}, "
                              f"{spec.architecture})"))
    print()
    print(render_choices(cfg, spec, choices))
    if not result.fits or args.suggest:
        print()
        print(render_suggestions(suggest(cfg, spec, options, result)))
    return 0 if result.fits else 1
