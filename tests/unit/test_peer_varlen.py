"""benchmarks/peers/verl_attn: the varlen attention registered for the peer benchmark's verl run
(`VERL_ATTN=varlen`). On the CPU its SDPA-per-segment path runs; the GPU kernel (torch's flash varlen)
is checked on the GPU by check_gpu.py against the same reference before verl starts.

The references are independent: attention computed in float64 sequence by sequence from its
definition, and a transformers Qwen2 model run on each sequence alone under eager attention."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "benchmarks" / "peers" / "verl_attn"
sys.path.insert(0, str(HERE))
import peer_varlen  # noqa: E402


def _reference(q, k, v, scale):
    """Causal attention of one sequence in float64: q (Hq, T, D), k/v (Hkv, T, D)."""
    groups = q.shape[0] // k.shape[0]
    k, v = (t.double().repeat_interleave(groups, dim=0) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    t = q.shape[1]
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def test_packed_row_equals_each_sequence_alone():
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 17, 1, 9]
    hq, hkv, dim = 6, 2, 16
    total = sum(lengths)
    q = torch.randn(1, hq, total, dim, generator=gen)
    k = torch.randn(1, hkv, total, dim, generator=gen)
    v = torch.randn(1, hkv, total, dim, generator=gen)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    out, weights = peer_varlen.varlen_attention_forward(None, q, k, v, None, scaling=0.25, position_ids=pos)
    assert weights is None and out.shape == (1, total, hq, dim)
    start = 0
    for n in lengths:
        ref = _reference(q[0, :, start : start + n], k[0, :, start : start + n], v[0, :, start : start + n], 0.25)
        got = out[0, start : start + n].transpose(0, 1).double()
        assert (got - ref).abs().max() < 1e-5, n
        start += n


def test_padding_mask_and_batch_rows():
    """A left-padded batch of two rows (a 2D mask, positions counted over the real tokens): each row's
    real tokens equal the sequence alone, padded slots are zero."""
    gen = torch.Generator().manual_seed(1)
    hq = hkv = 4
    dim, length = 8, 12
    real = [12, 7]
    mask = torch.zeros(2, length, dtype=torch.long)
    pos = torch.zeros(2, length, dtype=torch.long)
    for row, n in enumerate(real):
        mask[row, length - n :] = 1
        pos[row, length - n :] = torch.arange(n)
    q, k, v = (torch.randn(2, h, length, dim, generator=gen) for h in (hq, hkv, hkv))
    out, _ = peer_varlen.varlen_attention_forward(None, q, k, v, mask, scaling=dim**-0.5, position_ids=pos)
    for row, n in enumerate(real):
        s = length - n
        ref = _reference(q[row, :, s:], k[row, :, s:], v[row, :, s:], dim**-0.5)
        assert (out[row, s:].transpose(0, 1).double() - ref).abs().max() < 1e-5
        assert out[row, :s].abs().max() == 0 if s else True


def test_unsupported_settings_are_refused():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="dropout"):
        peer_varlen.varlen_attention_forward(None, q, q, q, None, dropout=0.1)
    with pytest.raises(ValueError, match="sliding window"):
        peer_varlen.varlen_attention_forward(None, q, q, q, None, sliding_window=2)
    with pytest.raises(ValueError, match="KV cache"):
        peer_varlen.varlen_attention_forward(None, q, q[:, :, :2], q[:, :, :2], None)


def test_transformers_model_on_a_packed_row():
    """A tiny Qwen2 under `peer_varlen` on one packed row (verl's remove-padding input: batch 1,
    position ids restarting at each sequence) gives each sequence's log-probs as eager attention
    does on that sequence alone (fp32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    peer_varlen.register()
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    eager = Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    varlen = Qwen2ForCausalLM._from_config(cfg, attn_implementation=peer_varlen.NAME).eval()
    varlen.load_state_dict(eager.state_dict())
    assert varlen.config._attn_implementation == peer_varlen.NAME
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 97, (n,), generator=gen) for n in (11, 30, 4)]
    ids = torch.cat(seqs).unsqueeze(0)
    pos = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)
    with torch.no_grad():
        packed = varlen(input_ids=ids, position_ids=pos, use_cache=False).logits[0].log_softmax(-1)
        start = 0
        for s in seqs:
            alone = eager(input_ids=s.unsqueeze(0), use_cache=False).logits[0].log_softmax(-1)
            assert (packed[start : start + len(s)] - alone).abs().max() < 2e-5
            start += len(s)


def test_sitecustomize_registers_on_first_transformers_import_only():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    code = (
        "import sys; assert 'transformers' not in sys.modules; import torch;"
        "assert 'transformers' not in sys.modules, 'imported eagerly';"
        "from transformers import AttentionInterface;"
        "from transformers.masking_utils import AttentionMaskInterface;"
        "assert 'peer_varlen' in AttentionInterface._global_mapping;"
        "assert 'peer_varlen' in AttentionMaskInterface._global_mapping; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
