#!/usr/bin/env bash
# Routing replay's effect on the rollout-vs-trainer log-prob gap and on the clip fraction (issue 15):
# the MoE demo (preset tiny_moe_cpu: the warm-started tiny Qwen3-MoE, Megatron EP2, vLLM TP2) run
# for STEPS GRPO steps once per actor.router_replay mode (off, rollout, old_logprob), with 4
# optimizer steps per RL step (the update drifts away from the old policy), then one table.
# DTYPE=bf16 (default) is where the two engines' kernels round differently and routing near-ties
# flip; in fp32 they agree to ~1e-6 either way. Works on CPU (gloo) and GPUs alike.
# Settings (env, defaults): STEPS=6 DTYPE=bf16 LAUNCHER=torchrun; extra key=value arguments are
# passed on.  Usage: bash benchmarks/moe_replay_gap.sh OUT_DIR [key=value ...]
set -euo pipefail
out=${1:?usage: moe_replay_gap.sh OUT_DIR [key=value ...]}
shift
for mode in off rollout old_logprob; do
  python3 -m verl_mp train --config-name tiny_moe_cpu actor.router_replay=$mode model.dtype="${DTYPE:-bf16}" \
    trainer.launcher="${LAUNCHER:-torchrun}" trainer.total_steps="${STEPS:-6}" trainer.test_freq=0 \
    trainer.val_before_train=false trainer.save_freq=0 trainer.save_final=false trainer.export_hf_at_end=false \
    actor.ppo_mini_batch_size=8 trainer.default_local_dir="$out/replay_$mode" "$@" > "$out/replay_$mode.log" 2>&1 \
    || { echo "router_replay=$mode failed, see $out/replay_$mode.log"; tail -5 "$out/replay_$mode.log"; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys
from statistics import mean
out = sys.argv[1]
keys = ("rollout/logprob_diff_max", "rollout/logprob_diff_mean", "actor/clipfrac", "reward/score/mean")
print("router_replay | " + " | ".join(keys) + "   (mean over steps)")
for mode in ("off", "rollout", "old_logprob"):
    rows = [json.loads(l) for l in open(f"{out}/replay_{mode}/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if "rollout/logprob_diff_max" in r]
    print(f"{mode} | " + " | ".join(f"{mean(r[k] for r in rows):.4g}" for k in keys))
PY
