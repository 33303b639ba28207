"""``verl-mp convert`` and ``verl-mp verify``: engine subcommands of the ``verl-mp`` CLI.

Wire into the main parser with ``add_subcommands(subparsers)``; each subcommand sets
``func`` (``args.func(args) -> int`` exit status). Every check that can fail (config,
architecture, shards, tensor shapes, TP/PP against heads/layers, rank count) runs before
any rank starts.

    verl-mp convert hf-to-megatron --src HF_DIR --out CKPT_DIR [--tp N --pp M --ep E --etp K]
    verl-mp convert megatron-to-hf --src CKPT_DIR --out HF_DIR [--tp N --pp M --ep E --etp K]
    verl-mp verify --model HF_DIR --tp N --pp M [--ep E --etp K] [--dtype fp32] [--tol 1e-4]
    verl-mp verify --model HF_DIR --tp N --pp M [--ep E] --rollout vllm --rollout-tp K [--rollout-ep]
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_mp.config.parallel import ParallelConfig, validate_layout
from verl_mp.config.rollout import (
    WEIGHT_SYNC_MODES,
    RolloutConfig,
    validate_moe_rollout,
    validate_rollout_layout,
    validate_sync_mode,
)
from verl_mp.rollout.compat import check_vllm
from verl_mp.utils.launch import launch_local

logger = logging.getLogger(__name__)

FP32_TOL = 1e-4
BF16_FLOOR, BF16_FACTOR = 5e-2, 1.5
"""bf16: the engine (bf16) is compared with HF in fp32 and may be off by at most
max(BF16_FLOOR, BF16_FACTOR x HF's own bf16-vs-fp32 difference) on the same tokens."""
ROLLOUT_BF16_TOL = 0.25
"""bf16 engine vs vLLM: different kernels round differently (measured max 0.008 on an H200)."""
TIMEOUT_S = 3600


def add_subcommands(subparsers) -> None:
    """Register ``convert`` and ``verify`` on an ``argparse`` subparsers object."""
    conv = subparsers.add_parser("convert", help="HF safetensors <-> megatron dist checkpoint")
    conv.add_argument("direction", choices=("hf-to-megatron", "megatron-to-hf"))
    conv.add_argument("--src", required=True, help="HF directory or engine checkpoint directory")
    conv.add_argument("--out", required=True, help="output directory")
    _layout_args(conv)
    conv.add_argument("--critic", action="store_true",
                      help="hf-to-megatron: build the critic (value head) engine")
    conv.set_defaults(func=run_convert)

    ver = subparsers.add_parser("verify", help="engine log-probs vs HF transformers at a TP/PP layout")
    ver.add_argument("--model", required=True, help="HF checkpoint directory")
    _layout_args(ver)
    ver.add_argument("--tol", type=float, default=None,
                     help=f"max |log-prob diff| vs HF fp32 allowed (default: {FP32_TOL} for fp32; "
                          f"for bf16 max({BF16_FLOOR}, {BF16_FACTOR} x HF bf16's own error))")
    ver.add_argument("--backend", default="auto", choices=("auto", "te", "sdpa", "local"))
    ver.add_argument("--rollout", choices=("vllm",), default=None,
                     help="also check the weight sync into a vLLM rollout engine")
    ver.add_argument("--rollout-tp", type=int, default=1, help="vLLM tensor-parallel size")
    ver.add_argument("--rollout-ep", action="store_true",
                     help="vLLM expert parallelism (rollout.expert_parallel; CUDA vLLM only)")
    ver.add_argument("--sync-mode", default="auto", choices=WEIGHT_SYNC_MODES,
                     help="weight sync mode (rollout.weight_sync_mode); local also checks that the "
                          "rank-local shards equal what vLLM's own loader builds")
    ver.set_defaults(func=run_verify)


def _layout_args(parser) -> None:
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (mixture-of-experts models)")
    parser.add_argument("--etp", type=int, default=None,
                        help="expert tensor-parallel size (default: the same as --tp)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))


def layout_from_args(args) -> ParallelConfig:
    return ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                          expert_model_parallel_size=args.ep, expert_tensor_parallel_size=args.etp)


def world_size(parallel: ParallelConfig) -> int:
    """The fewest ranks the layout runs on: TP x PP (attention) and expert-TP x EP x PP (experts)
    must both divide it."""
    return math.lcm(parallel.model_parallel_size, parallel.expert_tp_size * parallel.expert_model_parallel_size
                    * parallel.pipeline_model_parallel_size)


def layout_cli(parallel: ParallelConfig) -> list:
    """``--tp/--pp/--ep[/--etp]`` arguments of a rank program for ``parallel``."""
    etp = parallel.expert_tensor_parallel_size
    return ["--tp", parallel.tensor_model_parallel_size, "--pp", parallel.pipeline_model_parallel_size,
            "--ep", parallel.expert_model_parallel_size] + ([] if etp is None else ["--etp", etp])


def preflight(model_dir: str | Path, parallel: ParallelConfig, *, config_only: bool = False):
    """Validate the checkpoint and the layout (raises ValueError/FileNotFoundError); return its spec."""
    # lazy here and in run_convert: every `verl-mp` command imports this module to build its parser
    from verl_mp.models.hf_checkpoint import open_hf_checkpoint

    spec = open_hf_checkpoint(model_dir, config_only=config_only).spec
    flags = f"--tp {parallel.tensor_model_parallel_size} --pp {parallel.pipeline_model_parallel_size}"
    if parallel.expert_model_parallel_size != 1 or parallel.expert_tensor_parallel_size is not None:
        flags += " " + " ".join(str(a) for a in layout_cli(parallel)[4:])
    try:
        validate_layout(parallel, world_size(parallel), spec.shape, trainable=False)
    except ValueError as err:
        raise ValueError(f"{flags} does not fit {model_dir}: {err}") from None
    return spec


def run_verify(args) -> int:
    if args.rollout:
        return run_verify_rollout(args)
    parallel = layout_from_args(args)
    spec = preflight(args.model, parallel)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verify.json"
        cli = ["--model", args.model, *layout_cli(parallel), "--dtype", args.dtype,
               "--backend", args.backend, "--out", out]
        _launch("verl_mp.cli.rank_verify", world_size(parallel), cli)
        result = json.loads(out.read_text())
    tol = args.tol
    if tol is None:
        hf_err = result.get("hf_bf16_max_abs_diff")
        tol = FP32_TOL if hf_err is None else max(BF16_FLOOR, BF16_FACTOR * hf_err)
    passed = result["max_abs_diff"] <= tol
    line = {**result, "tol": tol, "passed": passed, "tp": args.tp, "pp": args.pp,
            **({"ep": args.ep, "etp": parallel.expert_tp_size} if spec.moe else {}),
            "arch": spec.architecture, "dtype": args.dtype, "reference": "hf-fp32"}
    print(json.dumps(line), flush=True)
    return 0 if passed else 1


def run_verify_rollout(args) -> int:
    """Engine -> vLLM: one optimizer step, a sync, then vLLM vs engine log-probs."""
    import torch

    parallel = layout_from_args(args)
    spec = preflight(args.model, parallel)
    train_world = world_size(parallel)
    world = max(train_world, args.rollout_tp)
    if world % train_world or world % args.rollout_tp:
        raise ValueError(f"the training layout's {train_world} ranks and --rollout-tp {args.rollout_tp} need a "
                         f"common world size; use sizes that divide each other")
    rollout_cfg = RolloutConfig(tensor_model_parallel_size=args.rollout_tp, expert_parallel=args.rollout_ep)
    validate_rollout_layout(rollout_cfg, world, spec.num_query_groups)
    if spec.moe is not None:
        validate_moe_rollout(rollout_cfg, world, torch.cuda.is_available())
    validate_sync_mode(args.sync_mode, args.tp, args.rollout_tp, "vllm", torch.cuda.is_available(),
                       setting="--sync-mode local")
    check_vllm()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verify_rollout.json"
        cli = ["--model", args.model, *layout_cli(parallel), "--rollout-tp", args.rollout_tp, "--dtype", args.dtype,
               "--sync-mode", args.sync_mode, "--out", out] + (["--rollout-ep"] if args.rollout_ep else [])
        _launch("verl_mp.cli.rank_verify_rollout", world, cli)
        result = json.loads(out.read_text())
    tol = args.tol if args.tol is not None else (FP32_TOL if args.dtype == "fp32" else ROLLOUT_BF16_TOL)
    gap = max(result["before_gap"], result["after_gap"])
    passed = gap <= tol and result["changed"] > gap and result.get("local_vs_loader_max_abs_diff", 0.0) == 0.0
    print(json.dumps({**result, "max_abs_diff": gap, "tol": tol, "passed": passed, "tp": args.tp,
                      "pp": args.pp, "rollout_tp": args.rollout_tp, "arch": spec.architecture,
                      **({"ep": args.ep, "etp": parallel.expert_tp_size, "rollout_ep": args.rollout_ep}
                         if spec.moe else {}),
                      "dtype": args.dtype, "reference": "megatron-engine"}), flush=True)
    return 0 if passed else 1


def run_convert(args) -> int:
    parallel = layout_from_args(args)
    if args.direction == "hf-to-megatron":
        preflight(args.src, parallel)
    else:
        from verl_mp.cli.rank_convert import HF_SUBDIR, checkpoint_role  # lazy: see preflight

        checkpoint_role(args.src)
        preflight(Path(args.src) / HF_SUBDIR, parallel, config_only=True)
    cli = [args.direction, "--src", args.src, "--out", args.out, *layout_cli(parallel),
           "--dtype", args.dtype] + (["--critic"] if args.critic else [])
    _launch("verl_mp.cli.rank_convert", world_size(parallel), cli)
    print(json.dumps({"converted": args.direction, "out": str(args.out), "tp": args.tp, "pp": args.pp,
                      "ep": args.ep, "etp": parallel.expert_tp_size}))
    return 0


def _launch(module: str, nproc: int, cli: list) -> None:
    try:
        launch_local(module, nproc, [str(a) for a in cli], timeout_s=TIMEOUT_S)
    except subprocess.CalledProcessError as err:
        print(f"{module} failed on {nproc} ranks (exit {err.returncode}); see the rank logs above",
              file=sys.stderr)
        raise SystemExit(err.returncode or 1) from None
