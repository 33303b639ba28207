"""`verl-mp train [--config-name PRESET] [key=value ...]`.

Loads the configuration (dataclass defaults <- preset YAML <- dotlist overrides), picks
the embedded demo when the user gave neither a model nor data, and hands the run to
`verl_mp.trainer.run.run`, which validates everything before any process starts.
"""

from __future__ import annotations

import argparse

from verl_mp.config.loader import list_presets, load_config, load_config_checked
from verl_mp.config.reference import resolved_rows
from verl_mp.config.schema import RootConfig
from verl_mp.utils.errors import ConfigErrors
from verl_mp.utils.logs import Heartbeat

DEMO_PRESET = "tiny_cpu"
"""The default preset: with no model.path and no data it runs the embedded demo."""


COMMON_KEYS = (
    "model.path", "model.dtype", "data.train_files", "data.val_files", "data.train_batch_size",
    "data.max_prompt_length", "algorithm.adv_estimator", "actor.optim.lr", "actor.ppo_mini_batch_size",
    "actor.micro_batch_size", "actor.megatron.tensor_model_parallel_size",
    "actor.megatron.pipeline_model_parallel_size", "rollout.tensor_model_parallel_size", "rollout.sampling.n",
    "rollout.sampling.max_new_tokens", "rollout.max_model_len", "trainer.launcher", "trainer.nproc",
    "trainer.total_steps", "trainer.save_freq", "trainer.test_freq", "trainer.default_local_dir",
    "trainer.resume_mode",
)
"""The keys `verl-mp train --help` lists with their defaults (docs/configuration.md has all)."""


def add_subcommands(sub) -> None:
    import argparse as ap

    p = sub.add_parser("train", help="run RL training (default: the embedded tiny CPU demo)",
                       description=__doc__.splitlines()[0], epilog=_keys_epilog(),
                       formatter_class=ap.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=train)
    config = sub.add_parser("config", help="show a resolved configuration with every key's docstring")
    show = config.add_subparsers(dest="action", required=True).add_parser(
        "show", help="every key of `--config-name` + overrides: value and docstring")
    show.add_argument("--config-name", default=DEMO_PRESET, help="preset or YAML path (default: the demo's)")
    show.add_argument("overrides", nargs="*", help="dotlist overrides")
    show.set_defaults(func=config_show)


def _keys_epilog() -> str:
    values = {key: value.strip("`") for key, _, value, _ in resolved_rows(RootConfig())}
    width = max(map(len, COMMON_KEYS))
    lines = ["most used keys (default); all: `verl-mp config show`, docs/configuration.md:"]
    lines += [f"  {key:<{width}}  {values.get(key, '?')}" for key in COMMON_KEYS]
    return "\n".join(lines)


def config_show(args) -> int:
    """Print every key of the resolved configuration, its value and its docstring."""
    cfg = load_config(args.config_name, args.overrides)
    for key, _, value, doc in resolved_rows(cfg):
        if value == "(section)":
            continue
        first = doc.split(". ")[0].replace("\n", " ").strip() if doc else ""
        print(f"{key} = {value.strip('`')}" + (f"    # {first}" if first else ""))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-name", default=DEMO_PRESET,
                   help=f"preset in megatron_configs/ ({', '.join(list_presets())}) or a YAML path "
                        f"(default: {DEMO_PRESET}, the embedded demo)")
    p.add_argument("--prepare-only", action="store_true",
                   help="validate, prepare the demo if needed, write the resolved config and plan, and stop "
                        "(multi-node launchers then start verl_mp.cli.rank_train on every node)")
    p.add_argument("--verbose", action="store_true",
                   help="show every library's log lines and warnings on the console (they always go to "
                        "<trainer.default_local_dir>/logs/)")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. actor.optim.lr=1e-6")


def train(args) -> int:
    """Every configuration error at once and within seconds (no model, data or demo needed to
    find them), then the demo's warm start if needed, then the run (which checks the rest)."""
    # lazy here and below: `verl-mp --help` and a config error exit within seconds; the run's
    # modules (planner, data, reward workers, Ray) are imported once the config is valid
    from verl_mp.trainer.config_check import config_errors

    cfg, errors = load_config_checked(args.config_name, args.overrides)
    if cfg is not None:
        errors += config_errors(cfg)
        refusal = None if cfg.model.path else demo_refusal(cfg, args.config_name)
        errors += [refusal] if refusal else []
    if errors:
        raise ConfigErrors(errors)
    from verl_mp.trainer.run import run

    if not cfg.model.path:
        with Heartbeat("preparing the embedded demo (data, tokenizer, warm start)"):
            cfg = demo_config(cfg, args.config_name)
    return run(cfg, prepare_only=args.prepare_only, verbose=args.verbose)


def demo_refusal(cfg, config_name: str) -> str | None:
    """Why a config without model.path cannot run the embedded demo, or None when it can: the
    demo never replaces what the user set, and runs only with a demo preset."""
    from verl_mp.demo.presets import DEMO_PRESETS  # lazy: ~70 ms that `verl-mp --help` need not pay

    given = [f"data.{k}={v}" for k in ("train_files", "val_files") if (v := getattr(cfg.data, k))]
    if given:
        return (f"model.path is empty but {', '.join(given)} is set: the embedded demo never replaces "
                "your data. Give model.path=HF_DIR to train your model on it, or leave model.path and "
                "data.* unset to run the demo (`verl-mp train`)")
    if config_name not in DEMO_PRESETS:
        return (f"model.path is empty: --config-name {config_name} needs model.path=HF_DIR and "
                "data.train_files=[...] (parquet). The embedded demo runs with the default preset: "
                "`verl-mp train` with no model or data (the mixture-of-experts demo: "
                "`verl-mp train --config-name tiny_moe_cpu`; multi-turn tool use: "
                "`verl-mp train --config-name tiny_tool_cpu`; on one GPU with the full Qwen2 "
                "vocabulary: `verl-mp train --config-name demo_gpu`)")
    return None


def demo_config(cfg, config_name: str):
    """The embedded demo, only when the user gave neither a model nor data: it never
    replaces what the user set."""
    from verl_mp.demo.presets import DEMO_PRESETS  # lazy: see demo_refusal
    from verl_mp.demo.warm_start import prepare_demo

    refusal = demo_refusal(cfg, config_name)
    if refusal:
        raise ValueError(refusal)
    return prepare_demo(cfg, DEMO_PRESETS[config_name])
