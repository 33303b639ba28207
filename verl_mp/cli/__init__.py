"""The `verl-mp` command line (also `python -m verl_mp`).

Subcommands register themselves through ``add_subcommands(subparsers)`` functions of
their layer's CLI module, so this file stays a table of contents.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from verl_mp.utils import launch
from verl_mp.utils.errors import RunFailed, StopNow
from verl_mp.utils.logs import setup_logging

# Modules that contribute subcommands, in help order. Each exposes add_subcommands().
SUBCOMMAND_MODULES = (
    "verl_mp.cli.train",
    "verl_mp.cli.engine",
    "verl_mp.planner.cli",
)


def _env(_args) -> int:
    """Print the versions and devices this install sees (one JSON line)."""
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.cuda.is_available(),
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    for name in ("megatron.core", "vllm", "ray", "transformers", "omegaconf", "triton"):
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as exc:  # report, don't fail: this command diagnoses installs
            info[name] = f"unavailable ({type(exc).__name__})"
    print(json.dumps(info))
    return 0


def _launch(args) -> int:
    """Run a module on N local ranks (torchrun) after the rank-count check."""
    launch.launch_local(args.module, args.nproc, args.args, module=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-mp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print versions and devices")
    env.set_defaults(func=_env)
    launch_cmd = sub.add_parser("launch", help="run a python module on N local ranks (torchrun)")
    launch_cmd.add_argument("--nproc", type=int, required=True)
    launch_cmd.add_argument("module")
    launch_cmd.add_argument("args", nargs=argparse.REMAINDER)
    launch_cmd.set_defaults(func=_launch)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(verbose=getattr(args, "verbose", True))
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # the user's input: one clear line, no traceback
        print(f"verl-mp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:  # the processes' own error, last and once (the log has the rest)
        print(f"verl-mp {args.command}: run failed: {exc}", file=sys.stderr)
        return 1
    except StopNow as exc:  # a second Ctrl-C: the run's processes are ended; one line, no traceback
        print(f"verl-mp {args.command}: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # Ctrl-C before any process of a run started (preflight, a warm start)
        print(f"verl-mp {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
