"""Triton kernel: GAE as one reverse scan over `[B, T]` (imported lazily by `gae.py`).

Walking t from the end, GAE carries two values: `nv`, the value of the next real token,
and `lg`, the advantage of the next real token. A padding step leaves both unchanged;
a real step sets

    lg' = gamma*lam*lg + delta_t,   delta_t = r_t + gamma*nv - v_t,   nv' = v_t.

Both updates are affine maps x -> a*x + e, which compose associatively, so a program
loads a coalesced tile of `BLOCK_B` rows x `BLOCK_T` steps and runs two
`tl.associative_scan`s along it instead of a sequential loop:
1. `nv` before each step: scan of the maps of the steps *after* it, loaded one element
   shifted (a cache hit); re-applying the map of the previous tile's last step to the
   carried state is harmless because these maps are idempotent;
2. `lg` after each step, from delta_t.
The state is carried from tile to tile, and the next tile is loaded before the current
one is scanned so that memory latency overlaps the arithmetic. Memory traffic: one read
of rewards/values/mask, one write of the two outputs.
"""

import triton
import triton.language as tl


@triton.jit
def _compose(a1, e1, a2, e2):
    """Apply x -> a1*x + e1, then x -> a2*x + e2."""
    return a1 * a2, a2 * e1 + e2


@triton.jit
def _load_tile(rewards_ptr, values_ptr, mask_ptr, row_base, row_ok, t, num_steps):
    """Rewards, values, mask at steps t and values, mask at t + 1; `[BLOCK_B, BLOCK_T]` fp32."""
    ok = row_ok[:, None] & (t >= 0)[None, :]
    offs = row_base[:, None] + t[None, :]
    r = tl.load(rewards_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    v = tl.load(values_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    m = (tl.load(mask_ptr + offs, mask=ok, other=0) != 0).to(tl.float32)
    ok_next = ok & (t + 1 < num_steps)[None, :]
    v_next = tl.load(values_ptr + offs + 1, mask=ok_next, other=0.0).to(tl.float32)
    m_next = (tl.load(mask_ptr + offs + 1, mask=ok_next, other=0) != 0).to(tl.float32)
    return r, v, m, v_next, m_next


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
    last = (j == BLOCK_T - 1)[None, :]
    carry_lg = tl.zeros([BLOCK_B], dtype=tl.float32)
    carry_nv = tl.zeros([BLOCK_B], dtype=tl.float32)
    t_next = num_steps - 1 - j  # descending time: processing order
    r_n, v_n, m_n, vs_n, ms_n = _load_tile(
        rewards_ptr, values_ptr, mask_ptr, row_base, row_ok, t_next, num_steps
    )
    for _ in range(0, num_steps, BLOCK_T):
        t = t_next
        r, v, m, v_shift, m_shift = r_n, v_n, m_n, vs_n, ms_n
        t_next = t - BLOCK_T
        r_n, v_n, m_n, vs_n, ms_n = _load_tile(
            rewards_ptr, values_ptr, mask_ptr, row_base, row_ok, t_next, num_steps
        )
        a_nv, e_nv = tl.associative_scan(
            (1.0 - m_shift, m_shift * v_shift), axis=1, combine_fn=_compose
        )
        next_value = a_nv * carry_nv[:, None] + e_nv
        delta = m * (r + gamma * next_value - v)
        a_lg, e_lg = tl.associative_scan(
            (m * (gamma * lam) + (1.0 - m), delta), axis=1, combine_fn=_compose
        )
        lg = a_lg * carry_lg[:, None] + e_lg
        ok = row_ok[:, None] & (t >= 0)[None, :]
        offs = row_base[:, None] + t[None, :]
        tl.store(adv_ptr + offs, m * lg, mask=ok)
        tl.store(ret_ptr + offs, m * (lg + v), mask=ok)
        carry_lg = tl.sum(tl.where(last, lg, 0.0), axis=1)
        carry_nv = tl.sum(tl.where(last, m * v + (1.0 - m) * next_value, 0.0), axis=1)
