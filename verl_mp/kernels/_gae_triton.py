"""Triton kernel: GAE as one reverse scan over `[B, T]` (imported lazily by `gae.py`).

Per token the GAE step is an affine map of the carried state (lastgaelam, nextvalue):

    real token:   lg' = gamma*lam*lg + gamma*nv + (r - v),   nv' = v
    padding:      lg' = lg,                                   nv' = nv

Maps of the form (lg, nv) -> (A*lg + Bc*nv + E, D*nv + F) compose associatively, so a
program loads a coalesced tile of `BLOCK_B` rows x `BLOCK_T` steps (walking t from the
end), composes the maps with one `tl.associative_scan` along the tile, applies the
composition to the state carried in from the previous tile, and carries the last column
on. Memory traffic is one read of rewards/values/mask and one write of the outputs.
"""

import triton
import triton.language as tl


@triton.jit
def _compose(a1, b1, d1, e1, f1, a2, b2, d2, e2, f2):
    """Apply map 1, then map 2."""
    return a2 * a1, a2 * b1 + b2 * d1, d2 * d1, a2 * e1 + b2 * f1 + e2, d2 * f1 + f2


@triton.jit
def gae_kernel(
    rewards_ptr,
    values_ptr,
    mask_ptr,
    adv_ptr,
    ret_ptr,
    num_rows,
    num_steps,
    gamma,
    lam,
    BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < num_rows
    row_base = rows.to(tl.int64) * num_steps
    j = tl.arange(0, BLOCK_T)
    carry_lg = tl.zeros([BLOCK_B], dtype=tl.float32)
    carry_nv = tl.zeros([BLOCK_B], dtype=tl.float32)
    for start in range(0, num_steps, BLOCK_T):
        t = num_steps - 1 - start - j  # descending time: processing order
        ok = row_ok[:, None] & (t >= 0)[None, :]
        offs = row_base[:, None] + t[None, :]
        r = tl.load(rewards_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(values_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        m = (tl.load(mask_ptr + offs, mask=ok, other=0) != 0).to(tl.float32)
        a, bc, d, e, f = tl.associative_scan(
            (m * (gamma * lam) + (1.0 - m), m * gamma, 1.0 - m, m * (r - v), m * v),
            axis=1,
            combine_fn=_compose,
        )
        lg = a * carry_lg[:, None] + bc * carry_nv[:, None] + e
        nv = d * carry_nv[:, None] + f
        tl.store(adv_ptr + offs, m * lg, mask=ok)
        tl.store(ret_ptr + offs, m * (lg + v), mask=ok)
        last = (j == BLOCK_T - 1)[None, :]
        carry_lg = tl.sum(tl.where(last, lg, 0.0), axis=1)
        carry_nv = tl.sum(tl.where(last, nv, 0.0), axis=1)
